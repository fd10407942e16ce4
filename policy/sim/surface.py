"""Response surfaces (DESIGN.md §5): generate them from the simulator, parse and validate them.

    collective,nbytes,algo,proto,nchannels,time_us,stddev_us

One row per available configuration of a (collective, nbytes) bucket; an empty
`nchannels` means NCCL's default; configurations not listed are unavailable.
Parsing is strict: the first bad row is an error naming its line and field,
and a surface without any row is an error too.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from typing import Final

from pydantic import BaseModel, ConfigDict

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.runtime.actions import Constraints
from dynamiccl.policy.sim.simulator import Simulator

HEADER: Final = ("collective", "nbytes", "algo", "proto", "nchannels", "time_us", "stddev_us")
DEFAULT_SIZES: Final = tuple(1 << k for k in range(3, 35, 2))  # 8 B .. 16 GiB, every 4x


class SurfaceError(ValueError):
    """A malformed surface; the message names the line and field."""


class SurfaceRow(BaseModel):
    """One configuration's measured (or simulated) time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective: Collective
    nbytes: int
    algo: Algo
    proto: Proto
    nchannels: int | None
    time_us: float
    stddev_us: float


class Surface(BaseModel):
    """A validated surface, rows grouped by (collective, nbytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: tuple[SurfaceRow, ...]

    def buckets(self) -> dict[tuple[Collective, int], list[SurfaceRow]]:
        """Rows per (collective, nbytes), in file order."""
        out: dict[tuple[Collective, int], list[SurfaceRow]] = {}
        for r in self.rows:
            out.setdefault((r.collective, r.nbytes), []).append(r)
        return out

    def best(self, collective: Collective, nbytes: int) -> SurfaceRow:
        """The fastest row of a bucket (KeyError if the bucket is absent)."""
        rows = self.buckets()[(collective, nbytes)]
        return min(rows, key=lambda r: r.time_us)


def _field(line: int, name: str, message: str) -> SurfaceError:
    return SurfaceError(f"line {line}: {name}: {message}")


def _enum(kind: type[Collective] | type[Algo] | type[Proto], line: int, name: str, raw: str) -> str:
    value = raw.strip().lower()
    allowed = [e.value for e in kind]
    if value not in allowed:
        raise _field(line, name, f"{raw!r} is not one of {', '.join(allowed)}")
    return value


def _number(line: int, name: str, raw: str, *, integer: bool) -> float:
    text = raw.strip()
    try:
        value = float(int(text)) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise _field(line, name, f"{raw!r} is not {kind}") from None
    if not math.isfinite(value):
        raise _field(line, name, f"{raw!r} is not finite")
    return value


def _row(line: int, cells: list[str]) -> SurfaceRow:
    if len(cells) != len(HEADER):
        raise SurfaceError(f"line {line}: expected {len(HEADER)} fields, got {len(cells)}")
    coll, nbytes, algo, proto, nch, time_us, stddev = cells
    n = _number(line, "nbytes", nbytes, integer=True)
    if n < 0:
        raise _field(line, "nbytes", f"must be >= 0 (got {nbytes.strip()})")
    channels: int | None = None
    if nch.strip():
        c = _number(line, "nchannels", nch, integer=True)
        if not 1 <= c <= 64:
            raise _field(line, "nchannels", f"must be empty or 1..64 (got {nch.strip()})")
        channels = int(c)
    t = _number(line, "time_us", time_us, integer=False)
    if t <= 0:
        raise _field(line, "time_us", f"must be > 0 (got {time_us.strip()})")
    s = _number(line, "stddev_us", stddev, integer=False)
    if s < 0:
        raise _field(line, "stddev_us", f"must be >= 0 (got {stddev.strip()})")
    return SurfaceRow(
        collective=Collective(_enum(Collective, line, "collective", coll)),
        nbytes=int(n),
        algo=Algo(_enum(Algo, line, "algo", algo)),
        proto=Proto(_enum(Proto, line, "proto", proto)),
        nchannels=channels,
        time_us=t,
        stddev_us=s,
    )


def parse_surface(text: str, *, source: str = "surface") -> Surface:
    """Validate a surface CSV; SurfaceError names the source, line and field."""
    try:
        reader = csv.reader(io.StringIO(text))
        lines = list(reader)
    except csv.Error as exc:
        raise SurfaceError(f"{source}: not valid CSV: {exc}") from None
    if not lines:
        raise SurfaceError(f"{source}: empty file (expected header {','.join(HEADER)})")
    header = tuple(h.strip() for h in lines[0])
    if header != HEADER:
        raise SurfaceError(f"{source}: line 1: header must be {','.join(HEADER)}")
    rows: list[SurfaceRow] = []
    seen: set[tuple[Collective, int, Algo, Proto, int | None]] = set()
    for i, cells in enumerate(lines[1:], start=2):
        if not cells or all(not c.strip() for c in cells):
            continue
        try:
            row = _row(i, cells)
        except SurfaceError as exc:
            raise SurfaceError(f"{source}: {exc}") from None
        key = (row.collective, row.nbytes, row.algo, row.proto, row.nchannels)
        if key in seen:
            raise SurfaceError(f"{source}: line {i}: duplicate configuration for this bucket")
        seen.add(key)
        rows.append(row)
    if not rows:
        raise SurfaceError(f"{source}: the surface has no valid row")
    return Surface(rows=tuple(rows))


def generate(
    sim: Simulator,
    collectives: Sequence[Collective] = tuple(Collective),
    sizes: Iterable[int] = DEFAULT_SIZES,
    constraints: Constraints | None = None,
) -> Surface:
    """Every feasible configuration (with channel variants) of every bucket, simulated."""
    rows: list[SurfaceRow] = []
    sizes = list(sizes)
    sigma = sim.noise.stddev
    for coll in collectives:
        configs = sim.configs(coll, constraints)
        if not configs:
            continue
        for nbytes in sizes:
            times = sim.config_times(coll, nbytes, configs)
            for cfg, t in zip(configs, times.tolist(), strict=True):
                if not math.isfinite(t):
                    continue
                rows.append(
                    SurfaceRow(
                        collective=coll,
                        nbytes=nbytes,
                        algo=cfg.algo,
                        proto=cfg.proto,
                        nchannels=cfg.nchannels,
                        time_us=round(t, 4),
                        stddev_us=round(sigma * t, 4),
                    )
                )
    if not rows:
        raise SurfaceError("the surface has no valid row (nothing is feasible)")
    return Surface(rows=tuple(rows))


def to_csv(surface: Surface) -> str:
    """The CSV text of a surface (round-trips through `parse_surface`)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(HEADER)
    for r in surface.rows:
        w.writerow(
            [
                r.collective.value,
                r.nbytes,
                r.algo.value,
                r.proto.value,
                "" if r.nchannels is None else r.nchannels,
                repr(r.time_us),
                repr(r.stddev_us),
            ]
        )
    return out.getvalue()

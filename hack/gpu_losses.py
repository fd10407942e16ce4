"""Where NCCL's own choice is not the fastest measured configuration, and whether that is noise.

Pure. Input: for each (collective, bytes) the points the sweep measured (every forced
configuration NCCL confirmed, and NCCL's own choice), each a mean, a standard deviation and the
number of timed iterations. A cell is a loss when the fastest forced point is faster than
NCCL's pick; it is outside the noise when the difference is more than `Z` standard errors of
the difference (Welch: sqrt(sd_a^2 / n_a + sd_b^2 / n_b)).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

Z = 3.0  # standard errors: a difference beyond this is not the iterations' noise


@dataclass(frozen=True)
class Point:
    """One measured configuration of one (collective, bytes) cell."""

    collective: str
    nbytes: int
    algo: str
    proto: str
    nchannels: int  # as NCCL ran it (its TUNING line); 0 = not printed
    mean_us: float
    sd_us: float
    n: int

    @property
    def label(self) -> str:
        """algo/proto/channels."""
        return f"{self.algo}/{self.proto}/{self.nchannels or '-'}"


@dataclass(frozen=True)
class Loss:
    """A cell where a forced configuration beat NCCL's own choice."""

    collective: str
    nbytes: int
    nccl: Point
    best: Point
    saving: float  # 1 - best / nccl
    z: float  # the difference in standard errors
    significant: bool  # z > Z


def _z(a: Point, b: Point) -> float:
    se = math.sqrt(a.sd_us**2 / max(a.n, 1) + b.sd_us**2 / max(b.n, 1))
    diff = a.mean_us - b.mean_us
    if se == 0.0:
        return math.inf if diff > 0 else 0.0
    return diff / se


def losses(forced: Iterable[Point], nccl: Iterable[Point]) -> list[Loss]:
    """Every cell where the fastest forced point is faster than NCCL's pick, biggest first."""
    best: dict[tuple[str, int], Point] = {}
    for p in forced:
        key = (p.collective, p.nbytes)
        if key not in best or p.mean_us < best[key].mean_us:
            best[key] = p
    out = []
    for own in nccl:
        key = (own.collective, own.nbytes)
        b = best.get(key)
        if b is None or b.mean_us >= own.mean_us:
            continue
        z = _z(own, b)
        out.append(Loss(own.collective, own.nbytes, own, b, 1 - b.mean_us / own.mean_us, z, z > Z))
    return sorted(out, key=lambda x: -x.saving)

"""A measured response surface and NCCL's own measured pick, as `bench tune`'s tuner takes them.

A sweep on real NCCL (`hack/gpu_sweep.py`, benchmarks/gpu/) writes two files in the
surface format (`dynamiccl.policy.sim.surface`): the forced configurations NCCL
confirmed it ran (`surface-N.csv`; an empty `nchannels` is NCCL's own channel count)
and what NCCL chose itself at each (collective, nbytes), with its time
(`nccl-pick-N.csv`; `nchannels` there is the count NCCL's log says it used).

Such a surface has holes: configurations NCCL ruled out, and the ones the sweep's
deadline cut. They are not offered: a bucket's arms are exactly its measured rows,
nothing is interpolated or invented. NCCL's pick is the arm of its (algo, proto) at
NCCL's own channel count (the row with an empty `nchannels`), else the row of its
(algo, proto) at the channel count it used; when the surface has neither, the pick's
own measured row joins the bucket as that arm. A bucket without a pick row has no
default (`DefaultPick` answers None); a pick row of a bucket the surface lacks is
left out (`MeasuredSurface.unused_picks` names them).

The measured times stand in for NCCL when the tuner plays a call (the one stand-in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynamiccl.api.nccl import Collective
from dynamiccl.policy.eval.bench_tune import Arm, DefaultPick, surface_arms
from dynamiccl.policy.sim.surface import Surface, SurfaceError, SurfaceRow, parse_surface

Key = tuple[Collective, int]


@dataclass(frozen=True)
class MeasuredSurface:
    """Arms per bucket and, per bucket with a pick, the arm NCCL chose itself."""

    buckets: dict[Key, list[Arm]]
    picks: dict[Key, Arm]
    unused_picks: tuple[Key, ...]

    def pick(self) -> DefaultPick:
        """NCCL's measured pick as `bench tune` asks for it (its index among the arms)."""

        def default(coll: Collective, nbytes: int, arms: Sequence[Arm]) -> int | None:
            arm = self.picks.get((coll, nbytes))
            return next((i for i, a in enumerate(arms) if a == arm), None)

        return default


def pick_rows(picks: Surface) -> dict[Key, SurfaceRow]:
    """One pick per (collective, nbytes); two different picks of a bucket are an error."""
    out: dict[Key, SurfaceRow] = {}
    for r in picks.rows:
        key = (r.collective, r.nbytes)
        if key in out:
            raise SurfaceError(f"NCCL's pick: two rows for {r.collective.value} {r.nbytes}")
        out[key] = r
    return out


def _pick_arm(arms: list[Arm], row: SurfaceRow) -> Arm:
    """The bucket's arm of NCCL's pick, appended to `arms` from `row` if it has none."""
    same = [a for a in arms if (a.algo, a.proto) == (row.algo, row.proto)]
    for channels in (None, row.nchannels):
        found = [a for a in same if a.nchannels == channels]
        if found:
            return found[0]
    arm = Arm(row.algo, row.proto, None, row.time_us, row.stddev_us)
    arms.append(arm)
    return arm


def measured(surface: Surface, picks: Surface) -> MeasuredSurface:
    """The surface's buckets with NCCL's pick of each (module docstring)."""
    buckets = surface_arms(surface)
    chosen: dict[Key, Arm] = {}
    unused: list[Key] = []
    for key, row in pick_rows(picks).items():
        if key in buckets:
            chosen[key] = _pick_arm(buckets[key], row)
        else:
            unused.append(key)
    return MeasuredSurface(buckets, chosen, tuple(unused))


def load_measured(surface: Path, picks: Path) -> MeasuredSurface:
    """`measured` of two files; OSError or SurfaceError names the file (and line)."""
    return measured(
        parse_surface(surface.read_text(), source=str(surface)),
        parse_surface(picks.read_text(), source=str(picks)),
    )

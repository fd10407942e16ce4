"""A response surface where reality departs from NCCL's cost model and from the shipped prior.

The calibrated simulator's times (`workload.build_time_table`) are what the
shipped model learned from; `Departure` changes one region of them the way real
hardware sometimes does and neither NCCL's cost model nor the simulator know:
by default, for all-reduce of 32 MiB and more, Tree runs 1.25x faster than
Ring with the same protocol and channels (the "Tree beats Ring across racks"
kind of finding, not one of the simulator's calibration departures). NCCL's
own cost table (what NCCL passes the tuner) stays the simulator's estimate, so
NCCL keeps choosing as if nothing changed.

`Departure(slow_pick=True)` is the other kind (issue 29): NCCL's own
(algorithm, protocol) for the call is slower than NCCL's model says at every
channel count, so that the best other pair (at its NCCL channel count) runs
`factor` x faster than it; channel variants of NCCL's pair cannot recover it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dynamiccl.api.nccl import Algo, Collective
from dynamiccl.testing.workload import Jitter, TimeTable, call_key


@dataclass(frozen=True)
class Departure:
    """Where reality departs: `faster` runs `factor` x faster than `than` (same proto, channels)."""

    collective: Collective = Collective.ALLREDUCE
    min_bytes: int = 32 << 20
    faster: Algo = Algo.TREE
    than: Algo = Algo.RING
    factor: float = 1.25
    slow_pick: bool = False  # NCCL's own pair slow at every channel count instead

    def describe(self) -> str:
        where = f"{self.collective.value} >= {self.min_bytes >> 20} MiB"
        if self.slow_pick:
            return (
                f"{where}: NCCL's own pair slow at every channel count, the best other pair "
                f"{self.factor:g}x faster"
            )
        return f"{where}: {self.faster.value} {self.factor:g}x faster than {self.than.value}"

    def applies(self, coll: int, nbytes: int) -> bool:
        return coll == self.collective.nccl_id and nbytes >= self.min_bytes


DEPARTURE_TREE: Final = Departure()
SLOW_PICK: Final = Departure(factor=1.15, slow_pick=True)


class Surface:
    """Mean time of a configuration of a call; jittered times for playing it."""

    def __init__(self, times: TimeTable, departure: Departure | None, seed: int = 0) -> None:
        self.times = times
        self.departure = departure
        self._jitter = Jitter(seed)
        self._slowdown: dict[tuple[int, int], tuple[tuple[int, int], float]] = {}

    def nccl_channels(self, coll: int, nbytes: int, algo: int, proto: int) -> int:
        """NCCL's own channel count for an (algorithm, protocol)."""
        return self.times.nccl_channels.get(f"{coll}:{nbytes}:{algo}:{proto}", 16)

    def cost(self, coll: int, nbytes: int) -> list[list[float]]:
        """NCCL's cost table for the call (its own model: it knows nothing of the departure)."""
        return self.times.cost[call_key(coll, nbytes)]

    def _sim(self, coll: int, nbytes: int, algo: int, proto: int, nch: int) -> float | None:
        t = self.times.time_us(coll, nbytes, algo, proto, nch, 0)
        if t is None:
            t = self.times.time_us(coll, nbytes, algo, proto, 0, 0)
        return t

    def nccl_pair(self, coll: int, nbytes: int) -> tuple[int, int]:
        """NCCL's own (algorithm, protocol) for the call."""
        a, p, _ = self.times.nccl_default[call_key(coll, nbytes)]
        return a, p

    def _slow_pick(self, coll: int, nbytes: int) -> tuple[tuple[int, int], float]:
        """NCCL's pair and its slowdown: the best other pair is `factor` x faster than it."""
        got = self._slowdown.get((coll, nbytes))
        if got is None:
            pick = self.nccl_pair(coll, nbytes)
            own = self._sim(coll, nbytes, *pick, self.nccl_channels(coll, nbytes, *pick))
            others = [
                t
                for a, row in enumerate(self.cost(coll, nbytes))
                for p, c in enumerate(row)
                if c >= 0 and (a, p) != pick
                and (t := self._sim(coll, nbytes, a, p, self.nccl_channels(coll, nbytes, a, p)))
            ]  # fmt: skip
            factor = self.departure.factor if self.departure else 1.0
            slow = max(factor * min(others) / own, 1.0) if own and others else 1.0
            got = self._slowdown[(coll, nbytes)] = (pick, slow)
        return got

    def mean_us(self, coll: int, nbytes: int, algo: int, proto: int, nch: int) -> float:
        """The true mean time (the simulator's, changed where the departure applies)."""
        d = self.departure
        if d is not None and d.slow_pick and d.applies(coll, nbytes):
            pick, slow = self._slow_pick(coll, nbytes)
            t = self._sim(coll, nbytes, algo, proto, nch)
            if t is None:
                raise ValueError(f"no time for {coll}:{nbytes}:{algo}:{proto}:{nch}")
            return t * slow if (algo, proto) == pick else t
        if d is not None and d.applies(coll, nbytes) and algo == d.faster.nccl_id:
            base = self._sim(coll, nbytes, d.than.nccl_id, proto, nch)
            if base is not None:
                return base / d.factor
        t = self._sim(coll, nbytes, algo, proto, nch)
        if t is None:
            raise ValueError(f"no time for {coll}:{nbytes}:{algo}:{proto}:{nch}")
        return t

    def play_us(self, coll: int, nbytes: int, algo: int, proto: int, nch: int) -> float:
        """A measured time: the mean with the simulator's 3 % lognormal jitter."""
        return self.mean_us(coll, nbytes, algo, proto, nch) * self._jitter()

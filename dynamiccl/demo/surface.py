"""A response surface where reality departs from NCCL's cost model and from the shipped prior.

The calibrated simulator's times (`workload.build_time_table`) are what the
shipped model learned from; `Departure` changes one region of them the way real
hardware sometimes does and neither NCCL's cost model nor the simulator know:
by default, for all-reduce of 32 MiB and more, Tree runs 1.25x faster than
Ring with the same protocol and channels (the "Tree beats Ring across racks"
kind of finding, not one of the simulator's calibration departures). NCCL's
own cost table (what NCCL passes the tuner) stays the simulator's estimate, so
NCCL keeps choosing as if nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamiccl.api.nccl import Algo, Collective
from dynamiccl.demo.workload import Jitter, TimeTable, call_key


@dataclass(frozen=True)
class Departure:
    """Where reality departs: `faster` runs `factor` x faster than `than` (same proto, channels)."""

    collective: Collective = Collective.ALLREDUCE
    min_bytes: int = 32 << 20
    faster: Algo = Algo.TREE
    than: Algo = Algo.RING
    factor: float = 1.25

    def describe(self) -> str:
        return (
            f"{self.collective.value} >= {self.min_bytes >> 20} MiB: {self.faster.value} "
            f"{self.factor:g}x faster than {self.than.value}"
        )


class Surface:
    """Mean time of a configuration of a call; jittered times for playing it."""

    def __init__(self, times: TimeTable, departure: Departure | None, seed: int = 0) -> None:
        self.times = times
        self.departure = departure
        self._jitter = Jitter(seed)

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

    def mean_us(self, coll: int, nbytes: int, algo: int, proto: int, nch: int) -> float:
        """The true mean time (the simulator's, changed where the departure applies)."""
        d = self.departure
        if (
            d is not None
            and coll == d.collective.nccl_id
            and nbytes >= d.min_bytes
            and algo == d.faster.nccl_id
        ):
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

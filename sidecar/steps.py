"""Training steps in one process's profiler records, found as they stream (no I/O, bounded memory).

The plugin writes one record per completed collective into the process's ring
(docs/plugin.md): communicator, collective, bytes, NCCL's per-communicator sequence
number and GPU start time. Point-to-point sends and receives (a pipeline's
activations) are not collectives and are not recorded; a pipeline stage is seen
through its tensor-parallel, data-parallel and embedding collectives.

Per communicator: sidecar/step_comm.py (records back in sequence order, the window, the
period search, the lock and its loss).

Per process (`StepDetector`): the *clock* is the locked communicator with the
longest step among those carrying at least `MIN_SHARE` of the process's calls (a
tensor-parallel communicator whose calls all look alike can lock onto a part of the
step only if that part is also regular in time; a communicator that logs once every
N steps carries too few calls to be the clock). Each boundary of the clock ends a
`Step` whose time runs from the GPU start of its first call to the next step's first
call. `status` is "found" while a clock exists, "none" once `none_after` calls came
with no step found (no repeating pattern: random sizes, an evaluation loop), and
"learning" before that.
"""

from __future__ import annotations

import statistics
from collections import deque
from enum import StrEnum
from typing import Final, NamedTuple

from dynamiccl.sidecar.step_comm import Boundary, Comm
from dynamiccl.sidecar.step_period import token

MAX_COMMS: Final = 32  # communicators tracked per process
MIN_SHARE: Final = 0.05  # of the process's calls, for a communicator to be the clock
HISTORY: Final = 64  # step times kept for the median
NONE_AFTER: Final = 4096  # calls with no step found before saying so


class Status(StrEnum):
    LEARNING = "learning"
    FOUND = "found"
    NONE = "none"


class Step(NamedTuple):
    """One training step, from its first call to the next step's first call."""

    comm_id: int  # the clock communicator
    coll_seq: int  # its sequence number at the step's first call
    start_ns: int  # GPU start of that call
    duration_ns: int  # to the GPU start of the next step's first call
    calls: int  # the clock communicator's calls per step (the period)


class StepDetector:
    """Steps of one process (one profiler ring), from its records in ring order."""

    def __init__(self, none_after: int = NONE_AFTER) -> None:
        self.none_after = none_after
        self.comms: dict[int, Comm] = {}
        self.clock: int | None = None
        self.calls = 0
        self.ignored = 0  # records of communicators beyond MAX_COMMS
        self.durations: deque[int] = deque(maxlen=HISTORY)
        self.steps = 0
        self._out: list[Boundary] = []

    def observe(
        self, comm_id: int, coll: int, nbytes: int, coll_seq: int, start_ns: int
    ) -> Step | None:
        """Take one record; returns the step it ended, if it began the clock's next step."""
        self.calls += 1
        c = self.comms.get(comm_id)
        if c is None:
            if len(self.comms) >= MAX_COMMS:
                self.ignored += 1
                return None
            c = self.comms[comm_id] = Comm()
        out = self._out
        if c.push(coll_seq, token(coll, nbytes), start_ns, out):
            if comm_id == self.clock:
                self.durations.clear()  # the clock's period changed
            self._choose_clock()
        if not out:
            return None
        last: Step | None = None
        if comm_id == self.clock:
            for b in out:
                if b.duration_ns > 0:
                    self.durations.append(b.duration_ns)
                    self.steps += 1
                    last = Step(comm_id, b.prev_seq, b.start_ns, b.duration_ns, b.calls)
        out.clear()
        return last

    def observe_block(
        self,
        comm_ids: list[int],
        colls: list[int],
        nbytes: list[int],
        coll_seqs: list[int],
        starts: list[int],
    ) -> list[Step]:
        """`observe` for a block of records in ring order; the steps they ended, in order.

        The same as `observe` record by record, with a shortcut for the common call of a
        communicator that is not locked: the next in sequence order, no search due (the
        window keeps it; nothing else happens)."""
        found: list[Step] = []
        comms, observe = self.comms, self.observe
        for cid, coll, n, seq, start in zip(
            comm_ids, colls, nbytes, coll_seqs, starts, strict=True
        ):
            c = comms.get(cid)
            if (
                c is not None
                and c.lock is None
                and seq == c.next_seq
                and not c.pending
                and c.since_try + 1 < c.try_every
            ):
                self.calls += 1
                c.next_seq = seq + 1
                c.calls += 1
                c.since_try += 1
                c.keep(seq, token(coll, n), start)
                continue
            step = observe(cid, coll, n, seq, start)
            if step is not None:
                found.append(step)
        return found

    def _choose_clock(self) -> None:
        best, best_ns = None, 0.0
        for cid, c in self.comms.items():
            if c.lock is None or c.calls < MIN_SHARE * self.calls:
                continue
            if c.lock.period.cycle_ns > best_ns:
                best, best_ns = cid, c.lock.period.cycle_ns
        if best != self.clock:
            self.clock = best
            self.durations.clear()

    @property
    def status(self) -> Status:
        if self.clock is not None:
            return Status.FOUND
        return Status.NONE if self.calls >= self.none_after else Status.LEARNING

    @property
    def settled(self) -> bool:
        """The clock's lock was found again by a later search on a window `CONFIRM_WINDOW`
        times longer (an early lock on a warm-up's calls or on a part of the step is
        replaced before that)."""
        c = self.comms.get(self.clock) if self.clock is not None else None
        return c is not None and c.lock is not None and c.lock.confirmed > 0

    @property
    def period(self) -> int:
        """The clock's calls per step (0: no clock)."""
        c = self.comms.get(self.clock) if self.clock is not None else None
        return c.lock.period.calls if c is not None and c.lock is not None else 0

    def median_step_ns(self) -> float | None:
        """Median of the last `HISTORY` step times (None before two boundaries)."""
        return float(statistics.median(self.durations)) if self.durations else None

    def signature(self) -> dict[int, tuple[tuple[int, int], ...]]:
        """Per locked communicator, one step's calls as (collective, bytes)."""
        return {
            cid: tuple((t & 7, t >> 3) for t in c.lock.period.template)
            for cid, c in self.comms.items()
            if c.lock is not None
        }

    def summary(self) -> dict[str, object]:
        """What the sidecar reports for this process."""
        clock = self.comms.get(self.clock) if self.clock is not None else None
        med = self.median_step_ns()
        return {
            "status": self.status.value,
            "steps": self.steps,
            "median_step_us": None if med is None else med / 1e3,
            "clock_comm": None if self.clock is None else f"{self.clock:#x}",
            "calls_per_step": None
            if clock is None or clock.lock is None
            else clock.lock.period.calls,
            "locked_comms": sum(1 for c in self.comms.values() if c.lock is not None),
            "ignored_records": self.ignored,
        }

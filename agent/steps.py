"""Training steps in one process's profiler records, found as they stream (no I/O, bounded memory).

The plugin writes one record per completed collective into the process's ring
(docs/plugin.md): communicator, collective, bytes, NCCL's per-communicator sequence
number and GPU start time. Point-to-point sends and receives (a pipeline's
activations) are not collectives and are not recorded; a pipeline stage is seen
through its tensor-parallel, data-parallel and embedding collectives.

Per communicator (`_Comm`): records are put back in sequence order (the ring holds
them in completion order, and a process's communicators run on several streams; a gap
that does not fill within `REORDER` records is a lost record), kept in a window of the
last `WINDOW` calls, and, until the communicator is *locked*, the window is searched
for its period (`agent.step_period.find_period`, each time the window has grown by as
much again as at the previous search, from `MIN_TRY` calls on; a locked communicator
is searched again on the same schedule until the window is full, and a different
period found replaces the lock). A locked communicator is tracked in O(1) per call: a
call equal to the template's next token advances it, another is an extra call
(skipped); the call at the template's first position is a step boundary. The lock is
lost when two periods' worth of calls pass without a boundary, when more than
`MAX_SKIP_RATE` of a block of calls were extra, when each of `LOST_SKIPS` steps in a
row had an extra call (the pattern grew), or when a step lasts `LONG_CYCLE` times the
period's length (the lock was taken on a part of the step whose calls repeat, such as
DDP buckets layer after layer, before the window held a whole step; a checkpoint pause
does this too, and the next search finds the step again in the window); the search
starts again at once on the whole window (a lock taken on a part of a step is replaced
by the step once the window holds three; the part-steps it reported before are a
known cost of the first steps of such a job), and after a change of pattern first on
the calls since the lock's last boundary alone.

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
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final, NamedTuple

from dynamiccl.agent.step_period import LOST, Period, find_period, token

WINDOW: Final = 8192  # calls kept per communicator for (re)learning
MAX_PERIOD: Final = 2048  # longest step, in one communicator's calls
REORDER: Final = 64  # out-of-order records held per communicator before a gap counts as lost
MAX_GAP: Final = 64  # a longer run of lost records restarts the learning window
LOST_SKIPS: Final = 4  # steps in a row with an extra call: the pattern changed
MAX_SKIP_RATE: Final = 0.1  # extra calls in a block of max(4 periods, 64) calls: lost
LONG_CYCLE: Final = 3.0  # a step this many times the period's length: lost
MIN_TRY: Final = 16  # calls in the window before the first search
MAX_COMMS: Final = 32  # communicators tracked per process
MIN_SHARE: Final = 0.05  # of the process's calls, for a communicator to be the clock
_CHANGED: Final = "changed"  # why a lock is lost: the calls changed
_PART: Final = "part"  # a step much longer than the period: the lock held a part of the step
HISTORY: Final = 64  # step times kept for the median
NONE_AFTER: Final = 4096  # calls with no step found before saying so
CONFIRM_WINDOW: Final = 4  # a lock is settled once a window this many times longer finds it


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


class _Boundary(NamedTuple):
    prev_seq: int  # the previous boundary's sequence number
    start_ns: int  # the previous boundary's GPU start
    duration_ns: int  # from it to this boundary; 0: unknown (the first, or records lost)
    calls: int


@dataclass(slots=True)
class _Lock:
    period: Period
    pos: int = 0  # next template position
    since: int = 0  # calls since the last boundary
    skips: int = 0  # extra calls in the current step
    skipped_steps: int = 0  # steps in a row with an extra call
    last_start: int = -1  # start of the last boundary (-1: none usable)
    last_seq: int = -1
    block_calls: int = 0  # calls and extra calls in the current block of the skip-rate check
    block_skips: int = 0
    window: int = 0  # calls in the window the period was found in
    confirmed: int = 0  # later searches, on windows CONFIRM_WINDOW times longer, that found it


@dataclass(slots=True)
class _Comm:
    """One communicator of the process."""

    next_seq: int = -1
    pending: dict[int, tuple[int, int]] = field(default_factory=dict)
    toks: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    starts: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    seqs: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    lock: _Lock | None = None
    since_try: int = 0
    try_every: int = MIN_TRY
    calls: int = 0
    lost_locks: int = 0
    reported: int = -1  # sequence number of the last boundary handed out
    fresh: int = -1  # calls since a change of pattern (-1: none pending)

    def push(self, seq: int, tok: int, start: int, out: list[_Boundary]) -> bool:
        """Take one record; boundaries found go to `out`; True if the lock changed."""
        if self.next_seq < 0:
            self.next_seq = seq
        if seq == self.next_seq:
            changed = self._take(seq, tok, start, out)
            while self.pending:
                nxt = self.pending.pop(self.next_seq, None)
                if nxt is None:
                    break
                changed |= self._take(self.next_seq, nxt[0], nxt[1], out)
            return changed
        if seq < self.next_seq:
            return False  # counted lost already, or a duplicate
        self.pending[seq] = (tok, start)
        if len(self.pending) <= REORDER:
            return False
        return self._skip_gap(out)

    def _skip_gap(self, out: list[_Boundary]) -> bool:
        """The missing records are lost: advance over them, then take what was held."""
        lo = min(self.pending)
        gap = lo - self.next_seq
        changed = False
        if self.lock is not None:
            lk, p = self.lock, self.lock.period.calls
            if lk.pos + gap >= p:
                lk.last_start = -1  # a boundary was among the lost records
            lk.pos = (lk.pos + gap) % p
            lk.since += gap
        if gap > MAX_GAP:
            self._clear(0)
        else:
            for k in range(gap):
                self._keep(self.next_seq + k, LOST, 0)
        self.next_seq = lo
        while self.pending:
            nxt = self.pending.pop(self.next_seq, None)
            if nxt is None:
                break
            changed |= self._take(self.next_seq, nxt[0], nxt[1], out)
        return changed

    def _keep(self, seq: int, tok: int, start: int) -> None:
        if self.fresh >= 0:
            self.fresh += 1
        self.toks.append(tok)
        self.starts.append(start)
        self.seqs.append(seq)

    def _clear(self, keep_last: int) -> None:
        for d in (self.toks, self.starts, self.seqs):
            kept = list(d)[len(d) - keep_last :] if keep_last else []
            d.clear()
            d.extend(kept)
        self.since_try, self.try_every = 0, MIN_TRY

    def _take(self, seq: int, tok: int, start: int, out: list[_Boundary]) -> bool:
        self.next_seq = seq + 1
        self.calls += 1
        self._keep(seq, tok, start)
        self.since_try += 1
        if self.lock is not None:
            why = self._track(self.lock, seq, tok, start, out)
            if why:
                return self._lose(why)
            if self.since_try < self.try_every or self.try_every >= WINDOW // 2:
                return False
            return self._learn(out)  # look again on more calls: a longer step replaces the lock
        if self.since_try < self.try_every:
            return False
        return self._learn(out)

    def _lose(self, why: str) -> bool:
        """Drop the lock. The window stays (it may hold the whole step); after a change of
        pattern the search also tries the calls since the lock's last boundary alone."""
        assert self.lock is not None
        self.lost_locks += 1
        if why == _CHANGED:
            self.fresh = min(self.lock.since, len(self.toks))
        self.lock = None
        self.since_try, self.try_every = 0, MIN_TRY
        return True

    def _learn(self, out: list[_Boundary]) -> bool:
        n = len(self.toks)
        self.since_try = 0
        self.try_every = min(2 * self.try_every, WINDOW // 2)
        toks, starts, seqs = list(self.toks), list(self.starts), list(self.seqs)
        if self.fresh >= n or (self.lock is not None and self.try_every >= WINDOW // 2):
            self.fresh = -1  # the window is all new, or the lock has held through it
        found = None
        if self.fresh >= 0:  # after a change of pattern: the new calls alone first
            cut = n - self.fresh
            found = find_period(toks[cut:], starts[cut:], max_period=MAX_PERIOD)
            if found is not None:
                found = replace(found, offset=found.offset + cut)
        if found is None:
            found = find_period(toks, starts, max_period=MAX_PERIOD)
        if found is not None and self.lock is not None and found.calls == self.lock.period.calls:
            self.lock.confirmed += n >= CONFIRM_WINDOW * self.lock.window
            return False
        if found is None:
            return False
        lk = self.lock = _Lock(found, window=n)
        for i in range(found.offset, n):  # replay: the steps already in the window
            if self._track(lk, seqs[i], toks[i], starts[i], out):
                self.lock = None
                out.clear()
                return False
        return True

    def _track(self, lk: _Lock, seq: int, tok: int, start: int, out: list[_Boundary]) -> str:
        """Advance the lock by one call; why the lock is lost, or "" while it holds."""
        tmpl = lk.period.template
        lk.since += 1
        if tok == LOST:
            if lk.pos == 0:
                lk.last_start = -1
            lk.pos = lk.pos + 1 if lk.pos + 1 < len(tmpl) else 0
            return ""
        lk.block_calls += 1
        if lk.block_calls >= max(4 * len(tmpl), 64):
            if lk.block_skips > MAX_SKIP_RATE * lk.block_calls:
                return _CHANGED
            lk.block_calls = lk.block_skips = 0
        if tok != tmpl[lk.pos]:
            lk.skips += 1
            lk.block_skips += 1
            return "" if lk.since <= 2 * len(tmpl) + 8 else _CHANGED
        if lk.pos == 0:
            if lk.skips:
                lk.skipped_steps += 1
                if lk.skipped_steps >= LOST_SKIPS:
                    return _CHANGED
            else:
                lk.skipped_steps = 0
            dur = start - lk.last_start if lk.last_start >= 0 else 0
            if dur > LONG_CYCLE * lk.period.cycle_ns:
                return _PART  # a quiet time the period does not hold: a part of the step
            if seq > self.reported:  # a replay after a relearn does not report a step twice
                self.reported = seq
                out.append(_Boundary(lk.last_seq, lk.last_start, max(dur, 0), len(tmpl)))
            lk.last_start, lk.last_seq, lk.since, lk.skips = start, seq, 1, 0
        lk.pos = lk.pos + 1 if lk.pos + 1 < len(tmpl) else 0
        return ""


class StepDetector:
    """Steps of one process (one profiler ring), from its records in ring order."""

    def __init__(self, none_after: int = NONE_AFTER) -> None:
        self.none_after = none_after
        self.comms: dict[int, _Comm] = {}
        self.clock: int | None = None
        self.calls = 0
        self.ignored = 0  # records of communicators beyond MAX_COMMS
        self.durations: deque[int] = deque(maxlen=HISTORY)
        self.steps = 0
        self._out: list[_Boundary] = []

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
            c = self.comms[comm_id] = _Comm()
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
                c._keep(seq, token(coll, n), start)
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

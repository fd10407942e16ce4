"""One communicator's step boundaries, found as its records stream (sidecar/steps.py's part).

Per communicator (`Comm`): records are put back in sequence order (the ring holds
them in completion order, and a process's communicators run on several streams; a gap
that does not fill within `REORDER` records is a lost record), kept in a window of the
last `WINDOW` calls, and, until the communicator is *locked*, the window is searched
for its period (`sidecar.step_period.find_period`, each time the window has grown by as
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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Final, NamedTuple

from dynamiccl.sidecar.step_period import LOST, Period, find_period

WINDOW: Final = 8192  # calls kept per communicator for (re)learning
MAX_PERIOD: Final = 2048  # longest step, in one communicator's calls
REORDER: Final = 64  # out-of-order records held per communicator before a gap counts as lost
MAX_GAP: Final = 64  # a longer run of lost records restarts the learning window
LOST_SKIPS: Final = 4  # steps in a row with an extra call: the pattern changed
MAX_SKIP_RATE: Final = 0.1  # extra calls in a block of max(4 periods, 64) calls: lost
LONG_CYCLE: Final = 3.0  # a step this many times the period's length: lost
MIN_TRY: Final = 16  # calls in the window before the first search
_CHANGED: Final = "changed"  # why a lock is lost: the calls changed
_PART: Final = "part"  # a step much longer than the period: the lock held a part of the step
CONFIRM_WINDOW: Final = 4  # a lock is settled once a window this many times longer finds it


class Boundary(NamedTuple):
    prev_seq: int  # the previous boundary's sequence number
    start_ns: int  # the previous boundary's GPU start
    duration_ns: int  # from it to this boundary; 0: unknown (the first, or records lost)
    calls: int


@dataclass(slots=True)
class Lock:
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
class Comm:
    """One communicator of the process."""

    next_seq: int = -1
    pending: dict[int, tuple[int, int]] = field(default_factory=dict)
    toks: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    starts: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    seqs: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    lock: Lock | None = None
    since_try: int = 0
    try_every: int = MIN_TRY
    calls: int = 0
    lost_locks: int = 0
    reported: int = -1  # sequence number of the last boundary handed out
    fresh: int = -1  # calls since a change of pattern (-1: none pending)

    def push(self, seq: int, tok: int, start: int, out: list[Boundary]) -> bool:
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

    def _skip_gap(self, out: list[Boundary]) -> bool:
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
                self.keep(self.next_seq + k, LOST, 0)
        self.next_seq = lo
        while self.pending:
            nxt = self.pending.pop(self.next_seq, None)
            if nxt is None:
                break
            changed |= self._take(self.next_seq, nxt[0], nxt[1], out)
        return changed

    def keep(self, seq: int, tok: int, start: int) -> None:
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

    def _take(self, seq: int, tok: int, start: int, out: list[Boundary]) -> bool:
        self.next_seq = seq + 1
        self.calls += 1
        self.keep(seq, tok, start)
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

    def _learn(self, out: list[Boundary]) -> bool:
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
        lk = self.lock = Lock(found, window=n)
        for i in range(found.offset, n):  # replay: the steps already in the window
            if self._track(lk, seqs[i], toks[i], starts[i], out):
                self.lock = None
                out.clear()
                return False
        return True

    def _track(self, lk: Lock, seq: int, tok: int, start: int, out: list[Boundary]) -> str:
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
                out.append(Boundary(lk.last_seq, lk.last_start, max(dur, 0), len(tmpl)))
            lk.last_start, lk.last_seq, lk.since, lk.skips = start, seq, 1, 0
        lk.pos = lk.pos + 1 if lk.pos + 1 < len(tmpl) else 0
        return ""

"""One communicator's step boundaries (sidecar/step_comm.py), record by record.

The process-level detector (clock choice, step times) is tested in test_steps.py;
these drive `Comm` directly: the order records arrive in, the lock, its loss.
"""

from __future__ import annotations

import itertools
import random

from dynamiccl.sidecar.step_comm import REORDER, Boundary, Comm
from dynamiccl.sidecar.step_period import token

STEP = [token(4, 1 << 20), token(4, 1 << 20), token(2, 4096), token(4, 8 << 20)]  # 4 calls
STEP_NS = 1_000_000  # each step lasts 1 ms on the GPU


def calls(steps: int) -> list[tuple[int, int, int]]:
    """(seq, token, start_ns) of `steps` steps of STEP, in sequence order."""
    n = len(STEP)
    return [(i, STEP[i % n], (i // n) * STEP_NS + (i % n) * 1000) for i in range(steps * n)]


def feed(c: Comm, recs: list[tuple[int, int, int]]) -> list[Boundary]:
    out: list[Boundary] = []
    got: list[Boundary] = []
    for seq, tok, start in recs:
        c.push(seq, tok, start, out)
        got += out
        out.clear()
    return got


def test_a_repeating_pattern_locks_and_each_boundary_times_one_step() -> None:
    c = Comm()
    got = feed(c, calls(40))
    assert c.lock is not None
    assert c.lock.period.calls == len(STEP)
    timed = [b for b in got if b.duration_ns]
    assert len(timed) >= 20
    assert {b.duration_ns for b in timed} == {STEP_NS}
    assert {b.calls for b in timed} == {len(STEP)}
    seqs = [b.prev_seq for b in timed]
    assert all(b - a == len(STEP) for a, b in itertools.pairwise(seqs))


def test_records_out_of_order_within_the_reorder_window_change_nothing() -> None:
    recs = calls(40)
    shuffled = recs[:8]  # the first record seen starts the sequence: it comes first
    rng = random.Random(7)
    for i in range(8, len(recs), 8):  # then completion order differs within blocks of 8
        block = recs[i : i + 8]
        rng.shuffle(block)
        shuffled += block
    in_order, reordered = Comm(), Comm()
    assert feed(reordered, shuffled) == feed(in_order, recs)
    assert reordered.calls == in_order.calls == len(recs)
    assert not reordered.pending


def test_a_gap_that_does_not_fill_is_lost_and_the_records_after_it_are_taken() -> None:
    recs = calls(60)
    c = Comm()
    feed(c, recs[:40])
    assert c.lock is not None
    missing = recs[40:42]
    after = recs[42 : 42 + REORDER + 1]  # one more than the reorder window holds
    feed(c, after)
    assert not c.pending  # the gap was given up on: everything after it was taken
    assert c.next_seq == after[-1][0] + 1
    assert missing[0][0] < c.next_seq
    feed(c, missing)  # arriving late: already counted lost, ignored
    assert c.next_seq == after[-1][0] + 1

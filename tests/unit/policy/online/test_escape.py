"""A committed arm measured far behind a look ends its epoch at once (`BucketTuner.escape_due`).

The drivers (`bench tune`, the sidecar's early round) fold as soon as the tuner says so:
every further call of a badly slow committed arm costs the gap, and no call of it can
change the decision (docs/benchmarks.md, "NCCL's default badly wrong").
"""

from __future__ import annotations

from dynamiccl.api.nccl import Collective
from dynamiccl.policy.online.tuner import BucketTuner, CellKey, TunerConfig, cell_tuner

KEY = CellKey(1, 0, 16, 2, Collective.ALLREDUCE, 20)


def _tuner(budget: int | None = None) -> BucketTuner:
    """NCCL's pick (arm 0, the prior's first choice), another protocol and another algorithm."""
    cfg = TunerConfig(budget_calls=budget)
    return cell_tuner([(1, 0), (1, 2), (0, 2)], [None, None, None], [1.0, 0.5, 0.25], 0,
                      cfg=cfg, key=KEY)  # fmt: skip


def test_a_look_far_ahead_of_the_committed_arm_makes_the_epoch_end_now() -> None:
    t = _tuner()
    t.observe(0, 300.0)
    t.observe(0, 303.0)
    assert not t.escape_due()  # nothing else measured
    t.observe(1, 100.0)  # one look, 3x faster
    assert t.escape_due()
    t.end_epoch()
    assert t.chosen() == 1  # the fold commits the look
    assert not t.escape_due()  # and the new epoch has nothing to escape from


def test_a_look_a_little_faster_waits_for_the_epochs_end() -> None:
    t = _tuner()
    for _ in range(3):
        t.observe(0, 100.0)
    t.observe(1, 96.0)  # 4 % faster, one call: within the noise of one look
    assert not t.escape_due()


def test_nothing_is_due_right_after_a_fold_or_once_the_budget_is_spent() -> None:
    t = _tuner(budget=4)
    t.observe(0, 300.0)
    t.observe(1, 100.0)
    t.end_epoch()
    assert t.chosen() == 1
    t.observe(1, 101.0)
    t.observe(1, 99.0)
    t.observe(2, 100.0)
    assert t.budget_spent
    t.observe(0, 10.0)  # a far faster call once the budget is spent: the final choice stands
    assert not t.escape_due()


def test_a_banned_arm_is_never_escaped_to() -> None:
    t = _tuner()
    t.observe(0, 300.0)
    t.observe(1, 100.0)
    t.banned[1] = True  # e.g. the step judge rejected it (sidecar/step_judge.py)
    assert not t.escape_due()

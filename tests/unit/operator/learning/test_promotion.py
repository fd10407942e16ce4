"""Promotion and rollback decisions (pure).

Which jobs get the canary: tests/unit/operator/controller/test_rollout_status.py.
"""

from __future__ import annotations

import math
import random

import pytest

from dynamiccl.api.registry import ModelStatus
from dynamiccl.operator.learning.promotion import (
    Criteria,
    Verdict,
    can_transition,
    judge,
)
from dynamiccl.operator.store.evidence import CellOutcome
from dynamiccl.operator.store.summary import JobOutcome


def outcomes(version: str, speedups: list[float], calls: int = 1000) -> list[JobOutcome]:
    return [
        JobOutcome(f"{version}-job-{i}", version, calls, 100.0, 100.0 * s)
        for i, s in enumerate(speedups)
    ]


def test_better_canary_is_promoted() -> None:
    outs = outcomes("v1", [1.10, 1.12, 1.08, 1.11]) + outcomes("v2", [1.25, 1.22, 1.27, 1.24])
    j = judge(outs, canary="v2", baseline="v1")
    assert j.verdict is Verdict.PROMOTE
    assert j.canary_speedup == pytest.approx(
        math.exp(sum(map(math.log, [1.25, 1.22, 1.27, 1.24])) / 4)
    )
    assert "faster" in j.reason


def test_worse_canary_is_rolled_back_early() -> None:
    outs = outcomes("v1", [1.10, 1.12, 1.08]) + outcomes("v2", [0.80, 0.82])
    j = judge(outs, canary="v2", baseline="v1")
    assert j.verdict is Verdict.ROLLBACK
    assert j.canary_jobs == 2
    assert "slower" in j.reason


def test_noise_and_small_samples_wait() -> None:
    outs = outcomes("v1", [1.10, 1.12, 1.08]) + outcomes("v2", [1.11, 1.09, 1.12])
    assert judge(outs, canary="v2", baseline="v1").verdict is Verdict.WAIT
    outs = outcomes("v1", [1.10, 1.12, 1.08]) + outcomes("v2", [1.5])
    assert judge(outs, canary="v2", baseline="v1").verdict is Verdict.WAIT
    # wildly noisy canary: the mean is higher but the bound is not conclusive
    outs = outcomes("v1", [1.10, 1.12, 1.08]) + outcomes("v2", [0.6, 2.5, 1.0, 1.9])
    assert judge(outs, canary="v2", baseline="v1").verdict is Verdict.WAIT


def test_jobs_with_too_few_calls_do_not_count() -> None:
    outs = outcomes("v1", [1.1] * 3) + outcomes("v2", [2.0] * 5, calls=10)
    j = judge(outs, canary="v2", baseline="v1", criteria=Criteria(min_calls_per_job=100))
    assert (j.verdict, j.canary_jobs) == (Verdict.WAIT, 0)


def test_without_baseline_jobs_the_baseline_is_nccl_default() -> None:
    assert judge(outcomes("v2", [1.3, 1.25, 1.28]), canary="v2", baseline=None).verdict is (
        Verdict.PROMOTE
    )
    assert judge(outcomes("v2", [0.7, 0.75]), canary="v2", baseline="v1").verdict is (
        Verdict.ROLLBACK
    )


def test_status_machine() -> None:
    assert can_transition(ModelStatus.CANDIDATE, ModelStatus.CANARY)
    assert can_transition(ModelStatus.CANARY, ModelStatus.ROLLED_BACK)
    assert can_transition(ModelStatus.CANARY, ModelStatus.PROMOTED)
    assert not can_transition(ModelStatus.ROLLED_BACK, ModelStatus.CANARY)
    assert not can_transition(ModelStatus.PROMOTED, ModelStatus.CANARY)


def test_a_canary_faster_overall_but_slower_in_one_cell_is_not_promoted() -> None:
    """Issue 29: the gain elsewhere (10 %) hid a 3.3 % loss in one cell and the judge, which
    compared whole jobs only, promoted the version; now it is rolled back, naming the cell."""
    jobs = outcomes("canary", [1.10, 1.11, 1.09, 1.10]) + outcomes("base", [1.0, 1.01, 0.99, 1.0])
    rng = random.Random(0)

    def cells(version: str, slow: float) -> list[CellOutcome]:
        out = []
        for i in range(4):
            for cell, t in ((("allreduce", 25, 32, 4), 500.0), (("allreduce", 16, 32, 4), 70.0)):
                mean = t * (slow if cell[1] == 16 else 0.9) * (1 + 0.002 * rng.gauss(0, 1))
                out.append(CellOutcome(f"{version}-job-{i}", version, cell, 1000, 1000 * mean))
        return out

    base = [CellOutcome(o.job_uid, o.model_version, o.cell, o.calls, o.time_us / 0.9)
            if o.cell[1] == 25 else o for o in cells("base", 1.0)]  # fmt: skip
    whole = judge(jobs, canary="canary", baseline="base")
    assert whole.verdict is Verdict.PROMOTE  # the whole-job comparison alone
    j = judge(jobs, canary="canary", baseline="base", cells=cells("canary", 1.033) + base)
    assert j.verdict is Verdict.ROLLBACK
    assert "allreduce/b16/32x4 3." in j.reason
    # the same cell within the noise and the margin: promoted
    same = judge(jobs, canary="canary", baseline="base", cells=cells("canary", 1.01) + base)
    assert same.verdict is Verdict.PROMOTE


def _in(cls: str, outs: list[JobOutcome]) -> list[JobOutcome]:
    return [
        JobOutcome(f"{cls}-{o.job_uid}", o.model_version, o.calls, o.measured_us,
                   o.nccl_default_us, cls)
        for o in outs
    ]  # fmt: skip


def test_the_canary_is_judged_against_the_promoted_versions_jobs_of_its_own_classes() -> None:
    """Issue 29: the promoted version's jobs on other hardware are no baseline. The canary ran
    on class A, 12 % faster than the promoted version there; the promoted version also ran
    on class B, where every configuration is faster. Compared within classes it is promoted;
    pooled across classes, as before, it looked 8 % slower and could never be promoted."""
    base_a = _in("A", outcomes("v1", [1.00, 1.01, 0.99, 1.00]))
    base_b = _in("B", outcomes("v1", [1.40, 1.41, 1.39, 1.42, 1.40, 1.38]))
    canary_a = _in("A", outcomes("v2", [1.12, 1.13, 1.11, 1.12]))
    j = judge(base_a + base_b + canary_a, canary="v2", baseline="v1")
    assert j.verdict is Verdict.PROMOTE, j.reason
    assert (j.canary_jobs, j.baseline_jobs) == (4, 4)
    assert j.baseline_speedup == pytest.approx(1.0, abs=0.01)
    pooled = [JobOutcome(o.job_uid, o.model_version, o.calls, o.measured_us, o.nccl_default_us)
              for o in base_a + base_b + canary_a]  # fmt: skip
    before = judge(pooled, canary="v2", baseline="v1")
    assert before.verdict is not Verdict.PROMOTE
    assert before.canary_speedup is not None
    assert before.baseline_speedup is not None
    assert before.canary_speedup < before.baseline_speedup
    # only class B has promoted-version jobs: nothing to compare the canary with yet
    j = judge(base_b + canary_a, canary="v2", baseline="v1")
    assert j.verdict is Verdict.WAIT
    assert j.canary_jobs == 0


def test_one_class_judges_exactly_as_the_two_sample_comparison() -> None:
    """Paired within one class is the plain comparison (the canary judge bench's figures)."""
    rng = random.Random(5)
    for _ in range(200):
        base = [math.exp(rng.gauss(0.05, 0.05)) for _ in range(rng.randint(1, 6))]
        can = [math.exp(rng.gauss(0.08, 0.05)) for _ in range(rng.randint(1, 6))]
        plain = judge(outcomes("v1", base) + outcomes("v2", can), canary="v2", baseline="v1")
        one = judge(
            _in("A", outcomes("v1", base) + outcomes("v2", can)), canary="v2", baseline="v1"
        )
        assert (plain.verdict, plain.canary_speedup) == (one.verdict, one.canary_speedup)

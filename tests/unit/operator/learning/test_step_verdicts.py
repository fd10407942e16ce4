"""A job's step verdicts (pure): one lying pod does not speak for its job, references skip
refused versions, a change whose collectives did not get faster is not a refusal, and the
step speedup is taken against the steps under NCCL's own choices."""

from __future__ import annotations

import pytest

from dynamiccl.api.rewards import StepStatus
from dynamiccl.operator.learning.step_verdicts import (
    LEARNING_REASON,
    NO_BASELINE_REASON,
    NO_STEP_REASON,
    job_status,
    report,
)
from dynamiccl.operator.store.steps import JobSteps, PodSteps, VersionCell

CELL = ("allreduce", 24, 8, 1)
OWN = ("tree", "ll128", 0, 0)
MANY = ("tree", "ll128", 32, 0)


def cells(*versions: tuple[int, tuple[str, str, int, int], str, float]) -> list[VersionCell]:
    return [VersionCell(v, CELL, cfg, origin, 1000, 1000 * us) for v, cfg, origin, us in versions]


def pods(medians: dict[str, dict[int, float]], steps: int = 50) -> JobSteps:
    return JobSteps(
        dict.fromkeys(medians, StepStatus.FOUND),
        [
            PodSteps(p, v, steps, m, 0.003 * m)
            for p, by_v in medians.items()
            for v, m in by_v.items()
        ],
    )


# NCCL's own at version 0; 32 channels at version 1: the all-reduce 575 -> 434 us
CALLS = cells((0, OWN, "default", 575.0), (1, MANY, "table", 434.0))


def test_status_and_why() -> None:
    assert job_status({}) == (None, "")
    assert job_status({"a": StepStatus.NONE, "b": StepStatus.NONE}) == (
        StepStatus.NONE,
        NO_STEP_REASON,
    )
    assert job_status({"a": StepStatus.NONE, "b": StepStatus.LEARNING})[1] == LEARNING_REASON
    assert job_status({"a": StepStatus.NONE, "b": StepStatus.FOUND})[0] is StepStatus.FOUND


def test_one_pod_of_three_saying_slower_is_not_the_jobs_word() -> None:
    honest = {0: 19_380.0, 1: 19_370.0}
    lying = {0: 19_380.0, 1: 20_860.0}
    assert report(pods({"p0": honest, "p1": honest, "p2": lying}), CALLS).refusals == []
    (r,) = report(pods({"p0": honest, "p1": lying, "p2": lying}), CALLS).refusals
    assert (r.pods_slower, r.pods_measured) == (2, 3)
    assert r.config == MANY
    assert r.kernel_speedup == pytest.approx(575 / 434)
    assert r.step_slowdown == pytest.approx(20_860 / 19_380 - 1)
    # a job of one pod: the pod is the job (findings then count it as one job's word)
    assert len(report(pods({"p0": lying}), CALLS).refusals) == 1


def test_slower_within_the_noise_or_without_faster_collectives_is_no_refusal() -> None:
    assert report(pods({"p0": {0: 19_380.0, 1: 19_500.0}}), CALLS).refusals == []  # < 1 %
    slower_kernel = cells((0, OWN, "default", 575.0), (1, MANY, "table", 600.0))
    assert report(pods({"p0": {0: 19_380.0, 1: 20_860.0}}), slower_kernel).refusals == []


def test_the_reference_skips_a_refused_version_and_a_revert_is_no_change() -> None:
    calls = CALLS + cells((2, OWN, "default", 575.0), (3, MANY, "table", 434.0))
    got = report(pods({"p0": {0: 19_380.0, 1: 20_860.0, 2: 19_390.0, 3: 20_850.0}}), calls)
    assert [r.table_version for r in got.refusals] == [1]  # one verdict per configuration


def test_step_speedup_against_the_steps_under_nccls_own_choices() -> None:
    got = report(pods({"p0": {0: 15_510.0, 1: 12_130.0}}, steps=100), CALLS)
    assert got.baseline_version == 0
    assert got.speedup == pytest.approx(2 * 15_510 / (15_510 + 12_130))
    # without a version that ran NCCL's own choices: no speedup, and the reason
    only_tuned = report(pods({"p0": {1: 12_130.0}}), CALLS)
    assert only_tuned.speedup is None
    assert only_tuned.reason == NO_BASELINE_REASON
    # a table that picks NCCL's own pair at NCCL's channels counts as NCCL's own
    as_table = cells((0, OWN, "default", 575.0), (1, OWN, "table", 575.0))
    assert report(pods({"p0": {1: 15_000.0}}), as_table).baseline_version == 1


def test_steps_of_another_period_are_another_step_and_never_a_refusal() -> None:
    """Seen in the learning sequence (issue 29): NCCL's own steps of one call each (377 us)
    against a version whose detector relearned a 466-call step (176 ms) were judged a 466x
    slowdown, and the job's refusal withdrew a cluster finding it had just measured 1.19x
    faster. Versions whose steps differ in period are not compared; the same periods are."""
    ref, new = (
        PodSteps("p0", 0, 2545, 377.4, 9.8, period=1),
        PodSteps("p0", 1, 1522, 176_114.0, 35.0, period=466),
    )
    relearned = JobSteps({"p0": StepStatus.FOUND}, [ref, new])
    assert report(relearned, CALLS).refusals == []
    same = JobSteps({"p0": StepStatus.FOUND}, [ref, PodSteps("p0", 1, 1522, 420.0, 9.8, period=1)])
    assert [r.config for r in report(same, CALLS).refusals] == [MANY]


def test_the_step_speedup_is_per_call_where_a_version_locked_on_several_steps() -> None:
    """A version whose detector locked on 4 steps at once (period 4: 4x the step, 1/4 of the
    steps) is no 4x slowdown in the job's step speedup: 100 steps of NCCL's own at 1 000 us,
    then 25 "steps" of 4 at 3 600 us (900 us a step) make 1 000 / 950 (was 1 000 x 125 /
    (100 000 + 90 000) = 0.66)."""
    own = PodSteps("p0", 0, 100, 1000.0, 3.0, period=1)
    locked = PodSteps("p0", 1, 25, 3600.0, 10.0, period=4)
    got = report(JobSteps({"p0": StepStatus.FOUND}, [own, locked]), CALLS)
    assert got.baseline_version == 0
    assert got.nccl_default_us is not None
    assert got.nccl_default_us / got.measured_us == pytest.approx(1000 / 950)

"""The canary judged inside its own jobs: both versions' choices measured in one job (issue 29)."""

from __future__ import annotations

import math

from dynamiccl.api.table import scale_class
from dynamiccl.api.tuning_run import Arm
from dynamiccl.operator.learning.within_job import (
    MIN_ARM_CALLS,
    PairedJob,
    paired_job,
    slower_cells,
    verdict,
)
from dynamiccl.operator.store.arms import ArmJob, ConfigTime

TREE = ("tree", "ll128", 0, 0)
RING = ("ring", "ll", 0, 0)
SCALE = scale_class(32, 4)


def _t(bucket: int, config: tuple[str, str, int, int], calls: int, mean: float,
       explore: int = 0) -> ConfigTime:  # fmt: skip
    return ConfigTime("allreduce", bucket, 32, 4, config, calls, explore, calls * mean,
                      explore * mean)  # fmt: skip


def _arm(bucket: int) -> Arm:
    return Arm.model_validate({
        "collective": "allreduce", "sizeBucket": bucket, "scale": SCALE,
        "choice": {"algo": "tree", "proto": "ll128"}, "baseline": {"algo": "ring", "proto": "ll"},
    })  # fmt: skip


def test_a_job_measures_what_the_promoted_choices_would_have_cost_it() -> None:
    job = ArmJob(
        "j1",
        (_arm(25),),
        (
            _t(25, TREE, 900, 80.0),  # the canary's choice
            _t(25, RING, 100, 100.0, explore=100),  # the promoted version's, explored
            _t(20, RING, 1000, 10.0),  # no arm: the same on both sides
        ),
    )
    p = paired_job(job)
    assert p is not None
    # with the canary's choice: 1000 calls at 80 us + 1000 at 10; the promoted's: 1000 at 100
    assert math.isclose(p.log_gain, math.log((100_000 + 10_000) / (80_000 + 10_000)))
    assert math.isclose(p.cells[("allreduce", 25, 32, 4)], math.log(100 / 80))


def test_an_arm_with_too_few_calls_is_no_comparison() -> None:
    job = ArmJob("j1", (_arm(25),), (_t(25, TREE, 900, 80.0), _t(25, RING, MIN_ARM_CALLS - 1, 1.0)))
    assert paired_job(job) is None


def _jobs(*gains: float) -> list[PairedJob]:
    return [PairedJob(f"j{i}", math.log(g), {("allreduce", 25, 32, 4): math.log(g)})
            for i, g in enumerate(gains)]  # fmt: skip


def _verdict(jobs: list[PairedJob]) -> str:
    return verdict(jobs, "v1", margin=0.02, alpha=0.05, min_jobs_promote=3,
                   min_jobs_rollback=2).action  # fmt: skip


def test_three_consistent_jobs_promote_and_two_do_not() -> None:
    assert _verdict(_jobs(1.12, 1.13)) == "wait"  # fewer jobs than a promotion needs
    assert _verdict(_jobs(1.12, 1.13, 1.125)) == "promote"


def test_a_slower_canary_is_rolled_back_after_two_jobs() -> None:
    assert _verdict(_jobs(0.85, 0.86)) == "rollback"


def test_one_lying_job_cannot_promote_a_canary_no_better_than_the_promoted_version() -> None:
    """A canary job's sidecar posts made-up rewards: its arms 'ran' 3x slower than the canary's
    choice. The honest jobs measured no difference (within their noise): no promotion, for any
    size of the lie and any number of honest jobs (the lie widens the spread as much as it
    moves the mean)."""
    for honest in (2, 3, 5, 9):
        for lie in (1.1, 1.5, 3.0, 100.0):
            gains = [1.0 + 0.002 * ((i % 3) - 1) for i in range(honest)] + [lie]
            assert _verdict(_jobs(*gains)) != "promote", (honest, lie)


def test_a_cell_slower_inside_the_jobs_rolls_back_whatever_the_rest_gains() -> None:
    cell_a, cell_b = ("allreduce", 25, 32, 4), ("allgather", 22, 32, 4)
    jobs = [PairedJob(f"j{i}", math.log(1.10), {cell_a: math.log(1.3), cell_b: math.log(g)})
            for i, g in enumerate((0.90, 0.91, 0.905))]  # fmt: skip
    assert slower_cells(jobs, margin=0.02, alpha=0.05, min_jobs=2) == ["allgather/b22/32x4 10.5%"]
    assert _verdict(jobs) == "rollback"

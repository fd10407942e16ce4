"""Rollout steps on a real store: canary → promotion; a worse model → rollback."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.registry import ModelStatus
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.api.table import scale_class
from dynamiccl.api.tuning_run import Arm
from dynamiccl.operator.learning.canary import Action, advance_rollout
from dynamiccl.operator.learning.promotion import Criteria
from dynamiccl.operator.store.arms import record_arms
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.registry import ModelRegistry


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


_uid = itertools.count()


def report(store: ExperienceStore, version: str, speedup: float, jobs: int = 4) -> None:
    for _ in range(jobs):
        n = next(_uid)
        rec: dict[str, Any] = {
            "collective": "allreduce",
            "size_bucket": 20,
            "nbytes_min": 1 << 20,
            "nbytes_max": (2 << 20) - 1,
            "nranks": 8,
            "nnodes": 1,
            "algo": "ring",
            "proto": "simple",
            "nchannels": 0,
            "chunk_bytes": 0,
            "origin": "table",
            "count": 500,
            "mean_time_us": 100.0,
            "p50_time_us": 100.0,
            "p99_time_us": 120.0,
            "busbw_GBps": 100.0,
            "nccl_default_time_us": 100.0 * speedup * (1 + 0.002 * (n % 3)),
        }
        store.insert_batch(
            RewardBatch.model_validate(
                {
                    "idempotency_key": f"pod-{n}/1",
                    "job": {
                        "namespace": "ns",
                        "kind": "PyTorchJob",
                        "name": f"j{n}",
                        "uid": f"job-{n}",
                    },
                    "pod": {"name": f"p{n}", "uid": f"pod-{n}"},
                    "model_version": version,
                    "table_version": 1,
                    "records": [rec],
                }
            )
        )


def test_canary_promotion_and_rollback(tmp_path: Path) -> None:
    clock = Clock()
    store = open_store(str(tmp_path / "e.db"), clock=clock)
    reg = ModelRegistry(store.backend, clock=clock)
    crit = Criteria(min_calls_per_job=100)
    try:
        reg.bootstrap("default", sha256="0" * 64, uri="/m/default.pt")
        assert advance_rollout(reg, store, canary_percent=10).action is Action.NONE
        report(store, "default", 1.10)  # before any canary: not part of the comparison

        reg.register("v2", sha256="2" * 64, uri="/m/v2.pt", parent="default")
        assert advance_rollout(reg, store, canary_percent=0).action is Action.NONE
        step = advance_rollout(reg, store, canary_percent=10)
        assert (step.action, step.version) == (Action.CANARY_STARTED, "v2")
        waiting = advance_rollout(reg, store, canary_percent=10, criteria=crit)
        assert waiting.action is Action.NONE  # no canary jobs yet
        report(store, "default", 1.10)
        report(store, "v2", 1.30)
        step = advance_rollout(reg, store, canary_percent=10, criteria=crit)
        assert (step.action, step.version) == (Action.PROMOTED, "v2"), step.reason
        assert step.judgement is not None
        assert step.judgement.canary_speedup is not None
        assert step.judgement.canary_speedup > 1.29
        assert {m.version: m.status for m in reg.list()} == {
            "default": ModelStatus.RETIRED,
            "v2": ModelStatus.PROMOTED,
        }

        reg.register("v3-worse", sha256="3" * 64, uri="/m/v3.pt", parent="v2")
        assert advance_rollout(reg, store, canary_percent=10).action is Action.CANARY_STARTED
        report(store, "v2", 1.30)
        report(store, "v3-worse", 0.85, jobs=2)
        step = advance_rollout(reg, store, canary_percent=10, criteria=crit)
        assert (step.action, step.version) == (Action.ROLLED_BACK, "v3-worse"), step.reason
        assert "slower" in step.reason
        promoted = reg.current(ModelStatus.PROMOTED)
        assert promoted is not None
        assert promoted.version == "v2"
        assert advance_rollout(reg, store, canary_percent=10).action is Action.NONE
    finally:
        store.close()


def test_two_replicas_one_transition(tmp_path: Path) -> None:
    clock = Clock()
    a = open_store(str(tmp_path / "e.db"), clock=clock)
    b = open_store(str(tmp_path / "e.db"), clock=clock)
    try:
        ra, rb = ModelRegistry(a.backend, clock=clock), ModelRegistry(b.backend, clock=clock)
        ra.register("v2", sha256="2" * 64, uri="/m/v2.pt")
        # replica B read the candidate list before A moved it (simulated by A acting first)
        assert advance_rollout(ra, a, canary_percent=5).action is Action.CANARY_STARTED
        assert advance_rollout(rb, b, canary_percent=5).action is Action.NONE
        assert [m.status for m in rb.list()] == [ModelStatus.CANARY]
    finally:
        a.close()
        b.close()


@pytest.fixture
def with_v2(tmp_path: Path) -> Iterator[tuple[ExperienceStore, ModelRegistry]]:
    """A store and its registry on one clock: the shipped model promoted, v2 its candidate."""
    clock = Clock()
    store = open_store(str(tmp_path / "e.db"), clock=clock)
    reg = ModelRegistry(store.backend, clock=clock)
    reg.bootstrap("default", sha256="0" * 64, uri="/m/default.pt")
    reg.register("v2", sha256="2" * 64, uri="/m/v2.pt", parent="default")
    try:
        yield store, reg
    finally:
        store.close()


def test_an_inconclusive_canary_makes_way_for_a_newer_candidate(
    with_v2: tuple[ExperienceStore, ModelRegistry],
) -> None:
    store, reg = with_v2
    crit = Criteria(min_calls_per_job=100)
    assert advance_rollout(reg, store, canary_percent=50).action is Action.CANARY_STARTED
    report(store, "default", 1.0, jobs=3)
    report(store, "v2", 1.0, jobs=1)
    reg.register("v3", sha256="3" * 64, uri="/m/v3.pt", parent="default")
    # one canary job: too early to give up on it
    assert advance_rollout(reg, store, canary_percent=50, criteria=crit).version == "v2"
    report(store, "v2", 1.0, jobs=1)
    step = advance_rollout(reg, store, canary_percent=50, criteria=crit)
    assert (step.action, step.version) == (Action.CANARY_STARTED, "v3"), step.reason
    assert "superseded" in step.reason
    assert {m.version: m.status for m in reg.list()}["v2"] is ModelStatus.ROLLED_BACK
    # a canary ahead by the margin keeps its place while its bound catches up
    report(store, "v3", 1.2, jobs=2)
    reg.register("v4", sha256="4" * 64, uri="/m/v4.pt", parent="default")
    step = advance_rollout(reg, store, canary_percent=50, criteria=crit)
    assert step.version == "v3"
    assert step.action is not Action.CANARY_STARTED


def _arm_job(store: ExperienceStore, uid: str, tree_us: float, ring_us: float) -> None:
    """A canary job that ran its table's Tree/LL128 (900 calls) and explored the promoted
    version's Ring/LL in the same cell (40 calls), its TuningRun's arms stored."""

    def rec(algo: str, proto: str, origin: str, mean: float, count: int) -> dict[str, Any]:
        return {"collective": "allreduce", "size_bucket": 25, "nbytes_min": 1 << 25,
                "nbytes_max": 1 << 25, "nranks": 32, "nnodes": 4, "algo": algo, "proto": proto,
                "nchannels": 0, "chunk_bytes": 0, "origin": origin, "count": count,
                "mean_time_us": mean, "p50_time_us": mean, "p99_time_us": mean * 1.1,
                "busbw_GBps": 1.0, "nccl_default_time_us": ring_us}  # fmt: skip

    store.insert_batch(RewardBatch.model_validate({
        "idempotency_key": f"pod-{uid}/1", "model_version": "v2", "table_version": 1,
        "job": {"namespace": "ns", "kind": "PyTorchJob", "name": uid, "uid": uid},
        "pod": {"name": f"p-{uid}", "uid": f"pod-{uid}"},
        "records": [rec("tree", "ll128", "table", tree_us, 900),
                    rec("ring", "ll", "explore", ring_us, 40)],
    }))  # fmt: skip
    arm = Arm.model_validate({
        "collective": "allreduce", "sizeBucket": 25, "scale": scale_class(32, 4),
        "choice": {"algo": "tree", "proto": "ll128"}, "baseline": {"algo": "ring", "proto": "ll"},
    })  # fmt: skip
    record_arms(store.backend, job_uid=uid, model_version="v2", baseline_version="default",
                arms=[arm], now=0.0)  # fmt: skip


def test_canary_jobs_that_measured_both_versions_promote_it_without_waiting_for_others(
    with_v2: tuple[ExperienceStore, ModelRegistry],
) -> None:
    """Three canary jobs, each measuring its choice 12-13 % faster than the promoted version's
    in the same job, and two jobs of the promoted version since the canary started (as fast
    over NCCL's default as the canary's): promoted on the comparisons inside the jobs.
    Compared with other jobs (the judge before), it waits for a third promoted-version job,
    and then finds no difference (both about 1.12x NCCL's default)."""
    store, reg = with_v2
    crit = Criteria(min_calls_per_job=100)
    assert advance_rollout(reg, store, canary_percent=20).action is Action.CANARY_STARTED
    report(store, "default", 1.12, jobs=2)
    _arm_job(store, "c1", 80.0, 90.0)
    _arm_job(store, "c2", 80.0, 90.5)
    step = advance_rollout(reg, store, canary_percent=20, criteria=crit)
    assert step.action is Action.NONE  # 2 jobs: fewer than a promotion needs
    _arm_job(store, "c3", 80.0, 90.2)
    step = advance_rollout(reg, store, canary_percent=20, criteria=crit)
    assert (step.action, step.version) == (Action.PROMOTED, "v2"), step.reason
    assert step.judgement is not None
    assert step.judgement.paired_jobs == 3
    assert step.judgement.baseline_jobs == 2
    assert "inside 3 canary job(s)" in step.reason

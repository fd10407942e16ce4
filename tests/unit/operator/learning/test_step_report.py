"""What the sidecar measured of the step reaches the TuningRun (issue 31.4): from the real
sidecar's reward batches, through the store, to the learning loop's status patch.

Real pieces: the sidecar's loop of tests/unit/sidecar/step_job.py (plugin `.so`, shared
memory, `Runner` with step detector and judge, its spool of reward batches), the
operator's store and the learning loop's TuningRun sync. The one stand-in for NCCL and
the GPU is the product's step model (step_job.py says how).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.kube import Resource
from dynamiccl.operator.learning.loop import LearningLoop, LoopConfig
from dynamiccl.operator.learning.step_verdicts import NO_STEP_REASON
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.testing.memory_api import Clock, MemoryAPI
from tests.unit.sidecar.conftest import ConfigDir, config_dir
from tests.unit.sidecar.step_job import (
    BUCKETS,
    DEFAULT_CHANNELS,
    OVERLAP_BOUND,
    StepJob,
    finding_table,
    model_step_us,
)

__all__ = ["config_dir"]  # the sidecar's config fixture
ROUNDS = 40  # 10 steps a round
LONG_ROUNDS = 110  # as the sidecar's own loop test: the tuner tries 32 channels and drops it


def tuning_run_status(job: StepJob, tmp_path: Path) -> dict[str, Any]:
    """Every batch the sidecar spooled, stored; the loop's TuningRun status of the job."""
    job.runner.cut(force=True)
    spool = job.runner.spool
    clock = Clock()
    store = open_store(str(tmp_path / "exp.db"), clock=clock)
    api = MemoryAPI(clock)
    try:
        batches = [
            RewardBatch.model_validate_json(spool.read_batch(q) or b"") for q in spool.outbox()
        ]
        assert batches
        for b in batches:
            store.insert_batch(b)
        meta = {"name": f"{batches[0].job.name}-dynamiccl", "namespace": batches[0].job.namespace}
        api.add(Resource("dynamiccl.io", "v1alpha1", "tuningruns"), {"metadata": meta})
        clock.t += 10
        cfg = LoopConfig(namespace="sys", image="i", store_url="u", pvc_name="p")
        loop = LearningLoop(store, ModelRegistry(store.backend, clock=clock), api, cfg, clock=clock)
        assert loop.sync_tuning_runs() == 1
        (run,) = [o for k, o in api.objs.items() if k[0] == "tuningruns"]
        return dict(run["status"])
    finally:
        store.close()


def play(job: StepJob, rounds: int, tmp_path: Path) -> dict[str, Any]:
    """Run the job's rounds, then its TuningRun status (the job closed either way)."""
    try:
        for _ in range(rounds):
            job.round()
        return tuning_run_status(job, tmp_path)
    finally:
        job.close()


def test_no_repeating_pattern_says_no_step_found_and_keeps_kernel_time(
    config_dir: ConfigDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bucket sizes drawn at random each step: the sidecar finds no step; the TuningRun
    says "no step found" with the reason, and reports the collectives' speedup."""
    job = StepJob(config_dir, tmp_path / "job", monkeypatch.setenv, OVERLAP_BOUND, pattern=False)
    status = play(job, ROUNDS, tmp_path)
    reward = status["reward"]
    assert reward["steps"]["status"] == "none"
    assert reward["steps"]["reason"] == NO_STEP_REASON
    assert "no step found" in reward["steps"]["reason"]
    assert reward["steps"].get("speedup") is None  # a null in a merge patch deletes
    assert reward["steps"]["refused"] == []
    assert reward["calls"] > 0
    assert reward["speedup"] is not None  # kernel time is what was judged, and reported


def test_overlap_bound_job_reports_its_step_and_the_refused_change(
    config_dir: ConfigDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DDP's repeating buckets on the overlap-bound job: 32 channels make the all-reduce
    faster and the step slower; the TuningRun reports the step-time speedup the rank
    got, next to the collectives' one, and the refused change."""
    job = StepJob(config_dir, tmp_path / "job", monkeypatch.setenv, OVERLAP_BOUND)
    status = play(job, LONG_ROUNDS, tmp_path)
    nccl = model_step_us(OVERLAP_BOUND, [DEFAULT_CHANNELS] * BUCKETS)
    played = nccl * len(job.step_us) / sum(job.step_us)  # the rank's step speedup
    reward = status["reward"]
    steps = reward["steps"]
    assert steps["status"] == "found"
    assert steps["reason"] == ""
    assert abs(steps["speedup"] / played - 1.0) <= 0.005
    assert reward["speedup"] >= 1.1 * steps["speedup"]  # kernel time alone would say more
    (refused,) = steps["refused"]
    assert refused["nchannels"] == 32
    assert refused["stepSlowdown"] >= 0.05
    assert refused["kernelSpeedup"] >= 1.1


def test_a_finding_in_the_first_table_that_slows_the_step_is_refused(
    config_dir: ConfigDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's first table carries a cluster finding (32 channels) that makes this
    overlap-bound job's step slower: the sidecar measured NCCL's own steps before it
    (version 0), so the TuningRun refuses the finding for this job, which findings then
    count against it (`stepSlower`)."""
    job = StepJob(
        config_dir, tmp_path / "job", monkeypatch.setenv, OVERLAP_BOUND, initial=finding_table()
    )
    status = play(job, ROUNDS, tmp_path)
    refused = status["reward"]["steps"]["refused"]
    assert [r["nchannels"] for r in refused] == [32]
    assert refused[0]["stepSlowdown"] >= 0.05
    assert refused[0]["kernelSpeedup"] >= 1.1

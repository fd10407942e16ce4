"""The learning loop refuses to learn a change whose collectives got faster while the steps
got slower (issue 31.4), and still learns one that made the steps faster.

Real pieces: the operator's store (SQLite), the learning loop's status sync (which judges
each job's step times and stores the refusals), the findings every new job of a hardware
class starts with, and the retraining reader (policy/train/store_data.py). The one
stand-in for the jobs is the product's step model (policy/sim/step.py) with the
simulator's bucket times (tests/unit/sidecar/step_job.py: 8x H200, tree / LL128, 24 DDP
buckets of 25 MiB, 575 us at NCCL's 8 channels, 434 us at 32): each job reports what
its sidecar would measure, first under NCCL's own choice (table version 0), then
under a table that commits 32 channels (version 1).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.kube import Resource
from dynamiccl.operator.learning.learning_status import class_findings
from dynamiccl.operator.learning.loop import LearningLoop, LoopConfig
from dynamiccl.operator.store.coverage import measured
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.features import record_features
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.policy.train.store_data import collect
from dynamiccl.testing.memory_api import Clock, MemoryAPI
from tests.unit.policy.train.test_offline import FEATURES
from tests.unit.sidecar.step_job import (
    BUCKET,
    BUCKETS,
    COMM_BOUND,
    DEFAULT_CHANNELS,
    OVERLAP_BOUND,
    Regime,
    bucket_us,
    model_step_us,
)

MANY = 32
CALLS = 2400  # 100 steps of 24 buckets under each table
STEPS = 100
JITTER = 0.003  # the steps' spread (as in the sidecar's loop test)
CLASS = "h200-8"
POLICY = {"metadata": {"name": "default"}, "spec": {"mode": "learned"}}
_seq = itertools.count(1)


def _record(nch: int, origin: str) -> dict[str, Any]:
    t = bucket_us(nch)
    return {
        "collective": "allreduce", "size_bucket": BUCKET.bit_length() - 1,
        "nbytes_min": BUCKET, "nbytes_max": BUCKET, "nranks": 8, "nnodes": 1,
        "algo": "tree", "proto": "ll128", "nchannels": 0 if origin == "default" else nch,
        "chunk_bytes": 0, "origin": origin, "count": CALLS, "mean_time_us": t,
        "p50_time_us": t, "p99_time_us": 1.03 * t, "busbw_GBps": 100.0,
        "nccl_default_time_us": bucket_us(DEFAULT_CHANNELS),
    }  # fmt: skip


def _batch(
    job: str, ns: str, pod: str, version: int, nch: int, *, step_us: float | None
) -> RewardBatch:
    steps = None
    if step_us is not None:
        steps = {"status": "found", "steps": STEPS, "median_us": step_us,
                 "spread_us": JITTER * step_us}  # fmt: skip
    return RewardBatch.model_validate(
        {
            "idempotency_key": f"{pod}/{next(_seq)}",
            "job": {"namespace": ns, "kind": "PyTorchJob", "name": job, "uid": f"uid-{job}"},
            "pod": {"name": pod, "uid": pod},
            "model_version": "default",
            "table_version": version,
            "records": [_record(nch, "default" if version == 0 else "table")],
            "steps": steps,
        }
    )


def play_job(
    store: ExperienceStore, job: str, ns: str, regime: Regime, *, steps: bool = True
) -> None:
    """The job's sidecar reports: NCCL's 8 channels (version 0), then 32 (version 1)."""
    for version, nch in ((0, DEFAULT_CHANNELS), (1, MANY)):
        step = model_step_us(regime, [nch] * BUCKETS) if steps else None
        store.insert_batch(_batch(job, ns, f"{job}-pod", version, nch, step_us=step))
    record_features(
        store.backend, job_uid=f"uid-{job}", namespace=ns, job_name=job,
        hardware_class=CLASS, features=FEATURES, now=0.0,
    )  # fmt: skip


def _loop(store: ExperienceStore, api: MemoryAPI, clock: Clock) -> LearningLoop:
    cfg = LoopConfig(namespace="sys", image="i", store_url="u", pvc_name="p")
    return LearningLoop(store, ModelRegistry(store.backend, clock=clock), api, cfg, clock=clock)


def learned(tmp_path: Path, regime: Regime, *, steps: bool = True) -> tuple[Any, Any, Any]:
    """Two jobs in two namespaces play the regime; the loop syncs their TuningRuns.
    (the class's findings for 32 channels, the retrain's data, one job's TuningRun status)"""
    clock = Clock()
    url = str(tmp_path / "exp.db")
    store = open_store(url, clock=clock)
    api = MemoryAPI(clock)
    for job, ns in (("a", "team-a"), ("b", "team-b")):
        api.add(Resource("dynamiccl.io", "v1alpha1", "tuningruns"),
                {"metadata": {"name": f"{job}-dynamiccl", "namespace": ns}})  # fmt: skip
        play_job(store, job, ns, regime, steps=steps)
    clock.t += 10
    loop = _loop(store, api, clock)
    assert loop.sync_tuning_runs() == 2
    found = class_findings(store, measured(store.backend), POLICY)
    many = [f for f in found.get(CLASS, []) if f.nchannels == MANY]  # listed once supported
    data = collect(url)
    status = api.objs[("tuningruns", "team-a", "a-dynamiccl")]["status"]
    store.close()
    return many, data, status


def _trained_on_many(data: Any) -> int:
    """Calls of 32 channels the retrain learns from."""
    return sum(n for (_, act), n in data.calls.items() if act[2] != 0)


def test_the_case_more_channels_faster_all_reduce_slower_step() -> None:
    assert bucket_us(MANY) <= 0.9 * bucket_us(DEFAULT_CHANNELS)
    nccl = model_step_us(OVERLAP_BOUND, [DEFAULT_CHANNELS] * BUCKETS)
    assert model_step_us(OVERLAP_BOUND, [MANY] * BUCKETS) >= 1.05 * nccl
    comm = model_step_us(COMM_BOUND, [DEFAULT_CHANNELS] * BUCKETS)
    assert model_step_us(COMM_BOUND, [MANY] * BUCKETS) <= 0.9 * comm


def test_kernel_time_alone_learns_the_overlap_bound_change(tmp_path: Path) -> None:
    """Without step times (sidecars before issue 31) the loop adopts 32 channels for every
    new job of the class and retrains on it: the rule that loses the step."""
    (many,), data, status = learned(tmp_path, OVERLAP_BOUND, steps=False)
    assert many.holds
    assert _trained_on_many(data) == 2 * CALLS
    assert status["reward"]["speedup"] > 1.0
    assert status["reward"].get("steps") is None


def test_overlap_bound_change_is_not_learned(tmp_path: Path) -> None:
    many, data, status = learned(tmp_path, OVERLAP_BOUND)
    assert not any(f.holds for f in many)  # new jobs do not start with it
    assert _trained_on_many(data) == 0  # the retrain does not learn it
    assert data.stats()["offline/skipped_step_slower"] == 2
    # the job's TuningRun says why: collectives faster, steps slower
    reward = status["reward"]
    assert reward["speedup"] > 1.0
    steps = reward["steps"]
    assert steps["status"] == "found"
    assert steps["speedup"] < 1.0
    (refused,) = steps["refused"]
    assert (refused["nchannels"], refused["tableVersion"]) == (MANY, 1)
    assert refused["stepSlowdown"] >= 0.05
    assert refused["kernelSpeedup"] >= 1.1


def test_communication_bound_change_is_still_learned(tmp_path: Path) -> None:
    (many,), data, status = learned(tmp_path, COMM_BOUND)
    assert many.holds
    assert many.step_slower == 0
    assert _trained_on_many(data) == 2 * CALLS
    assert data.stats()["offline/skipped_step_slower"] == 0
    steps = status["reward"]["steps"]
    assert steps["refused"] == []
    nccl = model_step_us(COMM_BOUND, [DEFAULT_CHANNELS] * BUCKETS)
    many_us = model_step_us(COMM_BOUND, [MANY] * BUCKETS)
    # 100 steps at NCCL's step, 100 at the tuned one: the whole job's step speedup
    assert steps["speedup"] == pytest.approx(2 * nccl / (nccl + many_us), rel=1e-6)
    assert steps["ncclDefaultSeconds"] == pytest.approx(2 * STEPS * nccl / 1e6, rel=1e-6)

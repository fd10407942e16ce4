"""Canary jobs' arms in the store (SQLite), and the experience the judge reads with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.api.tuning_run import Arm
from dynamiccl.operator.store.arms import arm_jobs, record_arms
from dynamiccl.operator.store.experience import ExperienceStore, open_store

ARM = Arm.model_validate({
    "collective": "allreduce", "sizeBucket": 25, "scale": 10,
    "choice": {"algo": "tree", "proto": "ll128"}, "baseline": {"algo": "ring", "proto": "ll"},
})  # fmt: skip


def _rec(algo: str, proto: str, origin: str, mean: float, count: int) -> dict[str, Any]:
    return {
        "collective": "allreduce", "size_bucket": 25, "nbytes_min": 1 << 25,
        "nbytes_max": 1 << 25, "nranks": 32, "nnodes": 4, "algo": algo, "proto": proto,
        "nchannels": 0, "chunk_bytes": 0, "origin": origin, "count": count,
        "mean_time_us": mean, "p50_time_us": mean, "p99_time_us": mean,
        "busbw_GBps": 1.0, "nccl_default_time_us": 100.0,
    }  # fmt: skip


def _post(store: ExperienceStore, uid: str, version: str, records: list[dict[str, Any]]) -> None:
    store.insert_batch(RewardBatch.model_validate({
        "idempotency_key": f"pod-{uid}/1", "model_version": version, "table_version": 1,
        "job": {"namespace": "a", "kind": "PyTorchJob", "name": uid, "uid": uid},
        "pod": {"name": f"p-{uid}", "uid": f"pod-{uid}"}, "records": records,
    }))  # fmt: skip


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """SQLite here; tests/integration/operator/test_store_postgres.py runs this module's tests
    on PostgreSQL too, with its own `store_url`."""
    return f"sqlite:///{tmp_path / 'experience.db'}"


def test_a_jobs_first_arms_stand_and_the_judge_reads_its_experience_with_them(
    store_url: str,
) -> None:
    store = open_store(store_url)
    b = store.backend
    assert record_arms(b, job_uid="c1", model_version="v2", baseline_version="v1",
                       arms=[ARM], now=1.0) == 1  # fmt: skip
    other = ARM.model_copy(update={"size_bucket": 20})
    assert (
        record_arms(
            b, job_uid="c1", model_version="v2", baseline_version="v1", arms=[other], now=2.0
        )
        == 0
    )  # the first record of a job stands
    assert record_arms(b, job_uid="c2", model_version="v2", baseline_version="v0",
                       arms=[ARM], now=1.0) == 1  # fmt: skip
    _post(store, "c1", "v2", [_rec("tree", "ll128", "table", 80.0, 900),
                              _rec("ring", "ll", "explore", 100.0, 40)])  # fmt: skip
    _post(store, "p1", "v1", [_rec("ring", "ll", "table", 100.0, 900)])  # no arms: not read
    (job,) = arm_jobs(b, "v2", "v1")  # c2 was compared with another version
    assert job.job_uid == "c1"
    assert [(a.size_bucket, a.choice.key, a.baseline.key) for a in job.arms] == [
        (25, ("tree", "ll128", 0, 0), ("ring", "ll", 0, 0))
    ]
    times = {t.config: t for t in job.times}
    assert (times[("tree", "ll128", 0, 0)].calls, times[("ring", "ll", 0, 0)].explore_calls) == (
        900, 40)  # fmt: skip
    assert times[("ring", "ll", 0, 0)].time_us == 4000.0
    assert arm_jobs(b, "v2", "v1", since_unix_s=4e9)[0].times == ()  # nothing since then

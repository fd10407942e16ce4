"""The features step stores what a TuningRun says of its job: features, and a canary's arms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynamiccl.operator.learning.features_sync import record_from_runs
from dynamiccl.operator.store.arms import arm_jobs
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.features import stored_features

ARM = {
    "collective": "allreduce", "sizeBucket": 25, "scale": 10,
    "choice": {"algo": "tree", "proto": "ll128"}, "baseline": {"algo": "ring", "proto": "ll"},
}  # fmt: skip


def _run(uid: str, **spec: Any) -> dict[str, Any]:
    spec = {"jobRef": {"name": uid, "uid": uid}, "features": {"version": 1}, **spec}
    return {"metadata": {"namespace": "a"}, "spec": spec}


def test_a_canary_runs_arms_are_stored_and_malformed_ones_lose_nothing_else(
    tmp_path: Path,
) -> None:
    store = open_store(str(tmp_path / "e.db"))
    runs = [
        _run("c1", modelVersion="v2", armsBaseline="v1", arms=[ARM]),
        _run("c2", modelVersion="v2", armsBaseline="v1", arms=[{**ARM, "scale": -1}]),
        _run("p1", modelVersion="v1"),
    ]
    assert record_from_runs(store, runs, now=1.0) == 3  # every job's features
    assert all(stored_features(store.backend, u) is not None for u in ("c1", "c2", "p1"))
    (job,) = arm_jobs(store.backend, "v2", "v1")
    assert job.job_uid == "c1"
    assert job.arms[0].baseline.key == ("ring", "ll", 0, 0)

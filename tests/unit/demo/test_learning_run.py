"""The demo's stand-in for the Job controller (`learning_run.run_retrain_job`): it runs the
retraining Job's container command here and writes the outcome into the Job's status in the
in-memory API, where the learning loop reads it (`LearningLoop` registers a version only for
a Job whose status says succeeded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynamiccl.demo.learning_run import run_retrain_job
from dynamiccl.operator.learning.loop import JOBS
from dynamiccl.operator.learning.retrain import RetrainSpec, build_retrain_job
from dynamiccl.testing.memory_api import MemoryAPI


def _job(api: MemoryAPI, command: list[str]) -> dict[str, Any]:
    """The operator's retraining Job manifest, created in ``api``, running ``command``."""
    spec = RetrainSpec(
        policy_name="p", policy_uid="p-uid", namespace="dynamiccl-system", image="local",
        store_url="sqlite:///x", new_version="p-20260101000000", parent_version="default",
        pvc_name="experience",
    )  # fmt: skip
    manifest = build_retrain_job(spec)
    manifest["spec"]["template"]["spec"]["containers"][0]["command"] = command
    return api.create(JOBS, manifest)


def _status(api: MemoryAPI, job: dict[str, Any]) -> Any:
    meta = job["metadata"]
    return api.get(JOBS, meta["name"], meta["namespace"]).get("status")


def test_a_finished_command_marks_the_stored_job_succeeded(tmp_path: Path) -> None:
    api = MemoryAPI()
    job = _job(api, ["dynamiccl", "train", "--help"])
    run_retrain_job(api, job, tmp_path / "train.yaml", tmp_path / "retrain.log")
    assert _status(api, job) == {"succeeded": 1}
    assert "Usage" in (tmp_path / "retrain.log").read_text()


def test_a_failed_command_marks_the_stored_job_failed_and_says_where_the_log_is(
    tmp_path: Path,
) -> None:
    api = MemoryAPI()
    job = _job(api, ["dynamiccl", "train", "--no-such-option"])
    with pytest.raises(RuntimeError, match=r"retraining failed \(2\); see .*retrain.log"):
        run_retrain_job(api, job, tmp_path / "train.yaml", tmp_path / "retrain.log")
    assert _status(api, job) == {"failed": 1}

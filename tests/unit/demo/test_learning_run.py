"""The learning half of a local cluster (`learning_run.LocalLoop`): the shipped model as the
promoted `default`, tables compiled per registered version by the operator's compiler, and one
turn of the real learning loop that retrains from the store's rows (the job's features stored
from its TuningRun) and starts the new version's canary. And the stand-in for the Job
controller (`run_retrain_job`): it runs the retraining Job's container command here and writes
the outcome into the Job's status, where the learning loop reads it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.registry import ModelStatus
from dynamiccl.api.rewards import JobRef, PodRef, RewardBatch, RewardRecord
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.learning_run import LocalLoop, policy_object, run_retrain_job
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import features
from dynamiccl.operator.learning.loop import JOBS, TUNING_RUNS
from dynamiccl.operator.learning.retrain import RetrainSpec, build_retrain_job
from dynamiccl.operator.store.features import stored_features
from dynamiccl.testing.memory_api import MemoryAPI
from dynamiccl.testing.sim_cluster import new_uid, node_topologies, nodes, pods, with_uid


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


def _features(spec: TopologySpec, job: dict[str, Any]) -> StateFeatures:
    rng = random.Random(0)
    owned = with_uid(job, new_uid(rng))
    objs, _ = pods(owned, spec, rng)
    return features.build(
        owned,
        job_annotations.parse(owned["metadata"]["annotations"]),
        pods=objs,
        nodes={n["metadata"]["name"]: n for n in nodes(spec)},
        node_topologies=node_topologies(spec),
    ).features


def _record(proto: str, mean: float) -> RewardRecord:
    return RewardRecord.model_validate(
        {
            "collective": "allgather",
            "size_bucket": 19,
            "nbytes_min": 737280,
            "nbytes_max": 737280,
            "nranks": 16,
            "nnodes": 2,
            "algo": "ring",
            "proto": proto,
            "nchannels": 0,
            "chunk_bytes": 0,
            "origin": "explore",
            "count": 500,
            "mean_time_us": mean,
            "p50_time_us": mean,
            "p99_time_us": mean,
            "busbw_GBps": 1.0,
            "nccl_default_time_us": 92.6,
        }
    )


POLICY = policy_object(
    "learned",
    NCCLTuningPolicySpec.model_validate(
        {"mode": "learned", "retraining": {"minNewExperience": 1, "canaryPercent": 100}}
    ),
)


def _local(tmp_path: Path) -> LocalLoop:
    return LocalLoop(tmp_path, [POLICY], train={"eval_jobs": 2, "seed": 0})


def test_the_packaged_model_is_the_promoted_default(tmp_path: Path) -> None:
    local = _local(tmp_path)
    try:
        (mv,) = local.registry.list()
        assert (mv.version, mv.status) == ("default", ModelStatus.PROMOTED)
        assert Path(mv.uri) == tmp_path / "models" / "default" / "model.pt"
    finally:
        local.close()


def test_one_turn_of_the_loop_retrains_from_the_store_and_starts_the_canary(
    tmp_path: Path, spec: TopologySpec, job: dict[str, Any]
) -> None:
    local = _local(tmp_path)
    try:
        f = _features(spec, job)
        ref = JobRef(namespace="ml-team", kind="PyTorchJob", name="j", uid="job-1")
        local.ingest.store.insert_batch(
            RewardBatch(
                idempotency_key="pod-1/1", job=ref, pod=PodRef(name="p", uid="pod-1"),
                model_version="default", table_version=1,
                records=(_record("ll", 92.6), _record("ll128", 72.4)),
            )
        )  # fmt: skip
        local.api.add(TUNING_RUNS, _tuning_run(f))
        events = local.learn()
        (new,) = [m for m in local.registry.list() if m.version != "default"]
        assert f"registered {new.version}" in events, events
        assert (new.status, new.parent) == (ModelStatus.CANARY, "default")
        assert new.experience_cursor == 2
        # both rows had their job's features, stored by the loop's features step
        metrics = (Path(new.uri).parent / "metrics.json").read_text()
        assert '"offline/used": 2.0' in metrics
        assert stored_features(local.ingest.store.backend, "job-1") is not None
        assert isinstance(local.compiler(f, NCCLTuningPolicySpec(), new.version), DecisionTable)
        (policy,) = local.policies()
        assert policy.learning is not None
        assert local.rollout is not None
    finally:
        local.close()


def _tuning_run(f: StateFeatures) -> dict[str, Any]:
    """The job's TuningRun, as the operator writes it: the features it tuned with."""
    return {
        "apiVersion": "dynamiccl.io/v1alpha1", "kind": "TuningRun",
        "metadata": {"name": "j-dynamiccl", "namespace": "ml-team"},
        "spec": {"jobRef": {"uid": "job-1", "name": "j", "kind": "PyTorchJob"},
                 "features": f.model_dump(mode="json")},
    }  # fmt: skip

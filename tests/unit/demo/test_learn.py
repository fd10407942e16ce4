"""Model versions in the demo: registry with digests, compiling per version, one fine-tune."""

from __future__ import annotations

import datetime as dt
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
from dynamiccl.demo.cluster import new_uid, node_topologies, nodes, pods, with_uid
from dynamiccl.demo.learn import DemoModelError, Models, operator_compiler
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import features
from dynamiccl.operator.controller.job_table import ModelUnavailable, shipped_compiler
from dynamiccl.operator.learning.canary import Action
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.features import stored_features
from dynamiccl.policy.train.inference import new_policy


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


def _models(tmp_path: Path) -> Models:
    shipped = tmp_path / "shipped.pt"
    new_policy(3, hidden=16).save(shipped)
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    models = Models(store, f"sqlite:///{tmp_path / 'store.sqlite'}", tmp_path / "models")
    models.bootstrap(shipped)
    return models


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


def test_the_shipped_model_is_the_promoted_default(tmp_path: Path) -> None:
    models = _models(tmp_path)
    (mv,) = models.versions()
    assert (mv.version, mv.status) == ("default", ModelStatus.PROMOTED)
    assert Path(mv.uri) == tmp_path / "models" / "default" / "model.pt"


def test_tables_compile_per_registered_version(
    tmp_path: Path, spec: TopologySpec, job: dict[str, Any]
) -> None:
    models = _models(tmp_path)
    f = _features(spec, job)
    table = models.compile(f, NCCLTuningPolicySpec(), "default")
    assert isinstance(table, DecisionTable)
    assert table.cells
    assert models.compile(f, NCCLTuningPolicySpec(), "unknown") is None
    # `default` is the demo's own model file here, not the packaged one: its export is used
    # (the operator's shipped compiler would compile the packaged model instead)
    shipped = shipped_compiler()
    assert shipped is not None
    assert shipped(f, NCCLTuningPolicySpec(), "default") != table


def test_a_model_file_that_changed_is_refused(tmp_path: Path) -> None:
    models = _models(tmp_path)
    path = tmp_path / "models" / "default" / "model.pt"
    path.write_bytes(path.read_bytes() + b"tampered")
    with pytest.raises(DemoModelError, match="sha256"):
        models.policy("default")
    with pytest.raises(DemoModelError, match="not registered"):
        models.policy("v9")


def test_one_retraining_registers_a_child_and_starts_its_canary(
    tmp_path: Path, spec: TopologySpec, job: dict[str, Any]
) -> None:
    models = _models(tmp_path)
    f = _features(spec, job)
    batch = RewardBatch(
        idempotency_key="pod-1/1",
        job=JobRef(namespace="ml-team", kind="PyTorchJob", name="j", uid="job-1"),
        pod=PodRef(name="p", uid="pod-1"),
        model_version="default",
        table_version=1,
        records=(_record("ll", 92.6), _record("ll128", 72.4)),
    )
    models.store.insert_batch(batch)
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    run = {  # the job's TuningRun, as the operator writes it: the features it tuned with
        "metadata": {"namespace": "ml-team"},
        "spec": {"jobRef": {"uid": "job-1", "name": "j"}, "features": f.model_dump(mode="json")},
    }
    mv, result = models.retrain(policy_name="ml-learned", runs=[run], fast=True, now=now)
    assert mv.version == "ml-learned-20260102030405"
    assert (mv.status, mv.parent) == (ModelStatus.CANDIDATE, "default")
    assert mv.experience_cursor == 2
    # both records had their job's features, stored by the learning loop's features step
    assert result["metrics"]["offline/used"] == 2.0
    assert stored_features(models.store.backend, "job-1") is not None
    assert models.policy(mv.version) is not models.policy("default")
    # the version's table comes from its numpy export, read as the ingest serves it to the
    # operator's RegistryCompiler: without the export there is none (the .pt alone is not used)
    assert isinstance(models.compile(f, NCCLTuningPolicySpec(), mv.version), DecisionTable)
    (tmp_path / "models" / mv.version / "model.npz").unlink()
    with pytest.raises(ModelUnavailable, match="no numpy export"):
        operator_compiler(models.registry, tmp_path / "op")(f, NCCLTuningPolicySpec(), mv.version)
    step = models.start_canary(100)
    assert (step.action, step.version) == (Action.CANARY_STARTED, mv.version)
    assert models.registry.get(mv.version).status is ModelStatus.CANARY  # type: ignore[union-attr]
    models.store.close()

"""Two DynamICCL releases in one cluster: each learning loop follows its own policy only.

Each release has its own real experience store and model registry (SQLite); the
cluster they share (cluster-scoped NCCLTuningPolicies, Namespaces, TuningRuns,
Jobs) is the in-memory stand-in for the API server of dynamiccl/testing/memory_api.py. The demo
release's policy has the higher priority, so a loop that followed the cluster's
one primary policy would retrain under it and write its rollout from either store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.kube import NAMESPACES
from dynamiccl.operator.learning import policy_scope
from dynamiccl.operator.learning.loop import JOBS, POLICIES, TUNING_RUNS, LearningLoop, LoopConfig
from dynamiccl.operator.learning.retrain import POLICY_LABEL
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.testing.memory_api import MemoryAPI


def _policy(name: str, release: str, priority: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "mode": "learned",
            "priority": priority,
            "selector": {"namespaceSelector": {"matchLabels": {"release": release}}},
            "retraining": {"minNewExperience": 1},
        },
    }


def _report(store: ExperienceStore, namespace: str, job: str, model: str) -> None:
    rec = {
        "collective": "allreduce", "size_bucket": 20, "nbytes_min": 1 << 20,
        "nbytes_max": (2 << 20) - 1, "nranks": 8, "nnodes": 1, "algo": "ring",
        "proto": "simple", "nchannels": 0, "chunk_bytes": 0, "origin": "table", "count": 100,
        "mean_time_us": 100.0, "p50_time_us": 100.0, "p99_time_us": 110.0, "busbw_GBps": 50.0,
        "nccl_default_time_us": 110.0,
    }  # fmt: skip
    ref = {"namespace": namespace, "kind": "PyTorchJob", "name": job, "uid": f"uid-{job}"}
    store.insert_batch(
        RewardBatch.model_validate(
            {
                "idempotency_key": f"pod-{job}/1",
                "job": ref,
                "pod": {"name": f"{job}-0", "uid": f"pod-{job}"},
                "model_version": model,
                "table_version": 1,
                "records": [rec],
            }
        )
    )


class Release:
    """One install: its own store, registry and loop, on the shared cluster."""

    def __init__(self, cluster: MemoryAPI, tmp: Path, name: str) -> None:
        self.store = open_store(str(tmp / f"{name}.db"))
        self.registry = ModelRegistry(self.store.backend)
        self.registry.bootstrap(f"{name}-v0", sha256="0" * 64, uri=f"/m/{name}.pt")
        cfg = LoopConfig(
            namespace=f"{name}-system",
            image="img:1",
            store_url="sqlite:////v/e.db",
            pvc_name="pvc",
            local_mount_path=str(tmp / name),
        )
        self.loop = LearningLoop(self.store, self.registry, cluster, cfg)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[MemoryAPI, Release, Release]]:
    api = MemoryAPI()
    for release in ("test", "demo"):
        api.add(
            NAMESPACES, {"metadata": {"name": f"team-{release}", "labels": {"release": release}}}
        )
    api.add(POLICIES, _policy("test-policy", "test", 0))
    api.add(POLICIES, _policy("demo-policy", "demo", 10))  # the cluster's primary
    test, demo = Release(api, tmp_path, "test"), Release(api, tmp_path, "demo")
    try:
        yield api, test, demo
    finally:
        test.store.close()
        demo.store.close()


def _learning(api: MemoryAPI, policy: str) -> dict[str, Any]:
    got: dict[str, Any] = api.objs[("nccltuningpolicies", None, policy)]["status"]["learning"]
    return got


def test_each_release_follows_only_its_own_policy(
    cluster: tuple[MemoryAPI, Release, Release],
) -> None:
    api, test, demo = cluster
    for ns in ("team-test", "team-demo"):
        api.add(TUNING_RUNS, {"metadata": {"name": "llm-dynamiccl", "namespace": ns}})
    _report(test.store, "team-test", "llm", "test-v0")
    _report(demo.store, "team-demo", "llm", "demo-v0")

    for rel in (test, demo, test, demo):  # interleaved ticks: neither undoes the other
        rep = rel.loop.tick()
        assert rep.errors == []

    assert _learning(api, "test-policy")["rollout"]["promoted"] == "test-v0"
    assert _learning(api, "demo-policy")["rollout"]["promoted"] == "demo-v0"
    # each retraining Job was started for the release's own policy, in its own namespace
    started = {
        (j["metadata"]["namespace"], j["metadata"]["labels"][POLICY_LABEL]) for j in api.list(JOBS)
    }
    assert started == {("test-system", "test-policy"), ("demo-system", "demo-policy")}


def test_a_release_with_no_rewards_yet_touches_no_policy(
    cluster: tuple[MemoryAPI, Release, Release],
) -> None:
    api, test, _demo = cluster
    rep = test.loop.tick()
    assert rep.errors == []
    assert api.patches_of(POLICIES) == []
    assert api.list(JOBS) == []


def test_in_scope_reads_kinds_and_namespace_labels() -> None:
    mpi_only = _policy("mpi", "test", 0)
    mpi_only["spec"]["selector"]["jobKinds"] = ["MPIJob"]
    everywhere = {"metadata": {"name": "all"}, "spec": {}}
    broken = {"metadata": {"name": "broken"}, "spec": {"selector": {"jobKinds": ["Pod"]}}}
    pols = [_policy("test-policy", "test", 0), mpi_only, everywhere, broken]
    labels = {"team-test": {"release": "test"}}
    names = [
        p["metadata"]["name"]
        for p in policy_scope.in_scope(pols, [("team-test", "PyTorchJob")], labels)
    ]
    assert names == ["test-policy", "all"]
    gone = policy_scope.in_scope(pols, [("deleted-ns", "PyTorchJob")], labels)
    assert [p["metadata"]["name"] for p in gone] == ["all"]

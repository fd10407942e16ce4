"""The learning loop's model lifecycle against a REAL kube-apiserver, through the operator's
adapter (`Kube`).

The loop's retraining Job (kwok completes its pod without running anything, so the
test runs the Job's own `dynamiccl train ...` command on the volume it names) yields a
model version that is registered by digest, goes canary, is promoted when the canary's
jobs measure faster; the next one is rolled back when its jobs measure slower (the
outcomes are reward batches as sidecars send them). Namespaces, policy and TuningRun:
learning_cluster.py.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.kube import Kube
from dynamiccl.operator.learning.loop import JOBS, LearningLoop, LoopConfig
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.registry import ModelRegistry
from tests.integration.operator.learning_cluster import loop_env

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def env(api: k8s.ApiClient, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with loop_env(api, tmp_path) as e:
        yield e


def _outcome_batch(
    ns: str, job_uid: str, version: str, speedup: float, seq: int, *, calls: int = 400
) -> RewardBatch:
    """What a job's sidecars report: `calls` measured calls at `speedup` over NCCL's default."""
    return RewardBatch.model_validate(
        {
            "idempotency_key": f"pod-{job_uid}/{seq}",
            "job": {"namespace": ns, "kind": "PyTorchJob", "name": f"j-{job_uid}", "uid": job_uid},
            "pod": {"name": f"j-{job_uid}-0", "uid": f"pod-{job_uid}"},
            "model_version": version,
            "table_version": 1,
            "records": [
                {
                    "collective": "allreduce",
                    "size_bucket": 20 + i,
                    "nbytes_min": 1 << (20 + i),
                    "nbytes_max": 1 << (20 + i),
                    "nranks": 16,
                    "nnodes": 2,
                    "algo": "ring",
                    "proto": "simple",
                    "nchannels": 0,
                    "chunk_bytes": 0,
                    "origin": "table",
                    "count": calls // 4,
                    "mean_time_us": 100.0 / speedup,
                    "p50_time_us": 100.0 / speedup,
                    "p99_time_us": 120.0 / speedup,
                    "busbw_GBps": 50.0,
                    "nccl_default_time_us": 100.0,
                }
                for i in range(4)
            ],
        }
    )


def _play_kubelet(kube: Kube, name: str, namespace: str) -> dict[str, Any]:
    """Run the retraining Job's container command here (kwok completes the pod but runs
    nothing), after the real Job controller saw the pod succeed."""
    deadline = time.monotonic() + 60
    job = kube.get(JOBS, name, namespace)
    while time.monotonic() < deadline and not (job.get("status") or {}).get("succeeded"):
        time.sleep(0.5)
        job = kube.get(JOBS, name, namespace)
    assert (job.get("status") or {}).get("succeeded"), (
        f"Job {name} did not complete: {job.get('status')}"
    )
    ctr = job["spec"]["template"]["spec"]["containers"][0]
    cmd = ctr["command"]
    assert cmd[:2] == ["dynamiccl", "train"]
    dynamiccl = str(Path(sys.executable).with_name("dynamiccl"))
    env = {**os.environ, **{e["name"]: e["value"] for e in ctr.get("env", []) if "value" in e}}
    proc = subprocess.run(
        [dynamiccl, *cmd[1:]], check=False, capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def test_retraining_job_canary_promotion_and_rollback(
    api: k8s.ApiClient, cluster_kubeconfig: Path, env: dict[str, Any]
) -> None:
    from dynamiccl.api.learning import LearningStatus, RolloutStatus  # noqa: PLC0415
    from dynamiccl.api.registry import ModelStatus  # noqa: PLC0415
    from dynamiccl.api.tuning_policy import ModelRollout  # noqa: PLC0415
    from dynamiccl.operator.controller.policy_match import choose_model  # noqa: PLC0415
    from dynamiccl.operator.learning.canary import Action  # noqa: PLC0415

    def gets_canary(uid: str, promoted: str, canary: str) -> bool:
        """The operator's decision for a new job under the loop's 50 % canary rollout."""
        rollout = RolloutStatus(promoted=promoted, canary=canary, canary_percent=50)
        return choose_model(ModelRollout(), uid, LearningStatus(rollout=rollout))[1]

    custom = k8s.CustomObjectsApi(api)
    name = env["policy"]["metadata"]["name"]
    custom.patch_cluster_custom_object(
        "dynamiccl.io",
        "v1alpha1",
        "nccltuningpolicies",
        name,
        {"spec": {"model": {"canaryVersion": "next", "canaryPercent": 50}}},
    )
    tmp: Path = env["tmp"]
    db = tmp / "experience.db"
    (tmp / "models" / "default").mkdir(parents=True)
    shutil.copy(ROOT / "policy" / "models" / "default.pt", tmp / "models" / "default" / "model.pt")
    store = open_store(str(db))
    registry = ModelRegistry(store.backend)
    kube = Kube(str(cluster_kubeconfig))
    loop = LearningLoop(
        store,
        registry,
        kube,
        LoopConfig(
            namespace=env["op_ns"],
            image="ghcr.io/example/dynamiccl:0.1.0",
            store_url=str(db),  # the Job's command runs here, on this volume
            pvc_name="dynamiccl-store",
            mount_path=str(tmp),
        ),
    )
    ns, seq, op_ns = env["user_ns"], itertools.count(1), env["op_ns"]
    core = k8s.CoreV1Api(api)
    # what the chart installs for the loop: the Job's service account and the store's volume
    # (a PV pre-bound to the claim: the PV controller binds it, the scheduler places the pod)
    core.create_namespaced_service_account(
        op_ns,
        {"metadata": {"name": "dynamiccl-train"}},  # type: ignore[arg-type]  # the client takes dict bodies
    )
    pv_name = f"{op_ns}-store"
    core.create_persistent_volume(
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": pv_name,
                "hostPath": {"path": str(tmp)},
                "claimRef": {"namespace": op_ns, "name": "dynamiccl-store"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        op_ns,
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "metadata": {"name": "dynamiccl-store"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": pv_name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    try:
        # jobs on the shipped model report enough experience: a retraining Job starts
        for uid in ("base-a", "base-b"):
            store.insert_batch(_outcome_batch(ns, uid, "default", 1.05, next(seq)))
        rep = loop.tick()
        assert rep.errors == [], rep.errors
        assert rep.launched_job is not None, rep
        _play_kubelet(kube, rep.launched_job, env["op_ns"])
        rep = loop.tick()  # the Job succeeded: its model is registered, the canary starts
        assert rep.errors == [], rep.errors
        (v1,) = rep.registered
        assert rep.rollout is not None
        assert (rep.rollout.action, rep.rollout.version) == (Action.CANARY_STARTED, v1)
        model = registry.get(v1)
        assert model is not None
        assert model.parent == "default"
        assert len(model.sha256) == 64
        assert model.status is ModelStatus.CANARY

        # new jobs: half get the canary (by uid); the canary's jobs measure 25 % faster
        uids = (f"job-{i}" for i in itertools.count())
        canary_jobs = [u for u in itertools.islice(uids, 40) if gets_canary(u, "default", v1)][:3]
        assert len(canary_jobs) == 3
        for uid in canary_jobs:
            store.insert_batch(_outcome_batch(ns, uid, v1, 1.25, next(seq)))
        time.sleep(1.1)  # model versions are named by the second
        rep = loop.tick()
        assert rep.rollout is not None
        assert (rep.rollout.action, rep.rollout.version) == (Action.PROMOTED, v1), rep.rollout
        promoted = registry.current(ModelStatus.PROMOTED)
        assert promoted is not None
        assert promoted.version == v1

        # the same tick started the next retraining (new experience since v1's cursor): it
        # fine-tunes the version promoted just now; its canary's jobs measure worse: rolled back
        assert rep.launched_job is not None, rep
        job = _play_kubelet(kube, rep.launched_job, env["op_ns"])
        cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert cmd[cmd.index("--parent") + 1] == v1
        rep = loop.tick()
        assert len(rep.registered) == 1, rep
        (v2,) = rep.registered
        assert registry.get(v2).parent == v1  # type: ignore[union-attr]
        assert rep.rollout is not None
        assert rep.rollout.action == Action.CANARY_STARTED
        more = (f"next-{i}" for i in itertools.count())
        picks = [(u, gets_canary(u, v1, v2)) for u in itertools.islice(more, 60)]
        for uid in [u for u, canary in picks if canary][:2]:
            store.insert_batch(_outcome_batch(ns, uid, v2, 0.80, next(seq)))
        for uid in [u for u, canary in picks if not canary][:3]:
            store.insert_batch(_outcome_batch(ns, uid, v1, 1.25, next(seq)))
        rep = loop.tick()
        assert rep.rollout is not None
        assert (rep.rollout.action, rep.rollout.version) == (Action.ROLLED_BACK, v2), rep.rollout
        assert registry.get(v2).status is ModelStatus.ROLLED_BACK  # type: ignore[union-attr]
        assert registry.current(ModelStatus.PROMOTED).version == v1  # type: ignore[union-attr]
    finally:
        store.close()
        core.delete_persistent_volume(pv_name)  # ours: created above

"""The learning loop against a REAL kube-apiserver, through the operator's adapter (`Kube`).

The repository's CRDs are applied; rewards stored in a real SQLite store end
up in the TuningRun's status (status subresource, validated by the CRD's
schema); enough experience creates a real retraining Job owned by the policy;
while it runs no second one starts; the ingest process runs the loop. The model
lifecycle (retraining Job, canary, promotion, rollback) is test_model_lifecycle_kube.py;
the namespaces, policy and batches both use: learning_cluster.py.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s

from dynamiccl.operator.kube import Kube
from dynamiccl.operator.learning.loop import JOBS, POLICIES, TUNING_RUNS, LearningLoop, LoopConfig
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.registry import ModelRegistry
from tests.integration.operator.learning_cluster import batch, loop_env


@pytest.fixture
def env(api: k8s.ApiClient, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with loop_env(api, tmp_path) as e:
        yield e


def test_loop_on_the_real_apiserver(
    api: k8s.ApiClient, cluster_kubeconfig: Path, env: dict[str, Any]
) -> None:
    store = open_store(str(env["tmp"] / "experience.db"))
    try:
        # the batch's job lives in the user namespace of this test
        b = batch(1).model_copy(
            update={"job": batch(1).job.model_copy(update={"namespace": env["user_ns"]})}
        )
        store.insert_batch(b)
        kube = Kube(str(cluster_kubeconfig))
        loop = LearningLoop(
            store,
            ModelRegistry(store.backend),
            kube,
            LoopConfig(
                namespace=env["op_ns"],
                image="ghcr.io/example/dynamiccl:0.1.0",
                store_url="sqlite:////var/lib/dynamiccl/experience.db",
                pvc_name="dynamiccl-store",
                local_mount_path=str(env["tmp"]),
            ),
        )
        rep = loop.tick()
        assert rep.errors == []
        assert rep.statuses_patched == 1
        tr = kube.get(TUNING_RUNS, "llm-dynamiccl", env["user_ns"])
        assert tr["status"]["reward"]["calls"] == 300
        assert abs(tr["status"]["reward"]["speedup"] - 1.25) < 1e-6
        assert [bk["sizeBucket"] for bk in tr["status"]["reward"]["buckets"]] == [16, 17, 18]
        assert rep.launched_job is None  # 3 rows < 6

        store.insert_batch(
            batch(2).model_copy(
                update={"job": batch(2).job.model_copy(update={"namespace": env["user_ns"]})}
            )
        )
        rep = loop.tick()
        assert rep.launched_job is not None, rep
        job = kube.get(JOBS, rep.launched_job, env["op_ns"])
        owner = job["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == (
            "NCCLTuningPolicy",
            env["policy"]["metadata"]["uid"],
        )
        assert job["spec"]["template"]["spec"]["containers"][0]["command"][:2] == [
            "dynamiccl",
            "train",
        ]
        rep = loop.tick()
        assert rep.launched_job is None
        assert rep.retrain is not None
        assert "still running" in rep.retrain.reason
        assert any(
            p["metadata"]["name"] == env["policy"]["metadata"]["name"] for p in kube.list(POLICIES)
        )
    finally:
        store.close()


def test_ingest_process_runs_the_loop(
    api: k8s.ApiClient, cluster_kubeconfig: Path, env: dict[str, Any]
) -> None:
    db = env["tmp"] / "proc.db"
    store = open_store(str(db))
    b = batch(7)
    store.insert_batch(
        b.model_copy(update={"job": b.job.model_copy(update={"namespace": env["user_ns"]})})
    )
    store.close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamiccl.operator.ingest.main",
            "--store",
            str(db),
            "--insecure-http",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--kubeconfig",
            str(cluster_kubeconfig),
            "--loop-namespace",
            env["op_ns"],
            "--loop-image",
            "ghcr.io/example/dynamiccl:0.1.0",
            "--loop-pvc",
            "store",
            "--loop-interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    custom = k8s.CustomObjectsApi(api)
    try:
        deadline = time.monotonic() + 60
        calls = None
        while time.monotonic() < deadline and proc.poll() is None:
            tr = cast(  # the custom-objects API returns the object's JSON
                dict[str, Any],
                custom.get_namespaced_custom_object(
                    "dynamiccl.io", "v1alpha1", env["user_ns"], "tuningruns", "llm-dynamiccl"
                ),
            )
            calls = ((tr.get("status") or {}).get("reward") or {}).get("calls")
            if calls:
                break
            time.sleep(0.5)
        assert calls == 300, proc.stderr.read() if proc.poll() is not None else "timeout"
    finally:
        proc.terminate()
        proc.wait(20)


# --- retraining, canary, promotion, rollback on the real API server -------------------------

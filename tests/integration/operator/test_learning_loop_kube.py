"""The learning loop against a REAL kube-apiserver, through the operator's adapter (`Kube`).

The repository's CRDs are applied; rewards stored in a real SQLite store end
up in the TuningRun's status (status subresource, validated by the CRD's
schema); enough experience creates a real retraining Job owned by the policy;
while it runs no second one starts. (No kubelet runs here, so the Job never
completes: the registration and rollout steps are covered in
tests/unit/operator/test_learning_loop.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.kube import Kube
from dynamiccl.operator.learning_loop import JOBS, POLICIES, TUNING_RUNS, LearningLoop, LoopConfig
from dynamiccl.operator.model_registry import ModelRegistry
from dynamiccl.operator.store import open_store

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))


def _kubeconfig() -> Path:
    for var in ("DYNAMICCL_KUBECONFIG", "KUBECONFIG"):
        if os.environ.get(var):
            return Path(os.environ[var].split(os.pathsep)[0]).expanduser()
    return CACHE / "cluster" / "kubeconfig"


def _api(kc: Path) -> k8s.ApiClient | None:
    try:
        api = k8s_config.new_client_from_config(config_file=str(kc))
        k8s.VersionApi(api).get_code(_request_timeout=5)
    except Exception:
        return None
    return api


@pytest.fixture(scope="module")
def api() -> k8s.ApiClient:
    kc = _kubeconfig()
    got = _api(kc)
    if got is None:
        subprocess.run(["bash", str(ROOT / "hack" / "cluster-up.sh")], check=False, timeout=3600)
        got = _api(kc)
    if got is None:
        pytest.fail(f"no reachable kube-apiserver at {kc} (hack/cluster-up.sh)")
    for name in ("dynamiccl.io_tuningruns.yaml", "dynamiccl.io_nccltuningpolicies.yaml"):
        doc = yaml.safe_load((ROOT / "crds" / name).read_text())
        ext = k8s.ApiextensionsV1Api(got)
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(doc["metadata"]["name"])
            doc["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(doc["metadata"]["name"], doc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            if conds.get("Established") == "True":
                break
            time.sleep(0.2)
    return got


@pytest.fixture
def env(api: k8s.ApiClient, tmp_path: Path) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    user_ns, op_ns, policy = f"loop-user-{suffix}", f"loop-op-{suffix}", f"loop-{suffix}"
    core = k8s.CoreV1Api(api)
    for ns in (user_ns, op_ns):
        core.create_namespace({"metadata": {"name": ns}})
    custom = k8s.CustomObjectsApi(api)
    pol = custom.create_cluster_custom_object(
        "dynamiccl.io",
        "v1alpha1",
        "nccltuningpolicies",
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": policy},
            # a high priority: this test's policy is the primary one whatever else exists
            "spec": {"mode": "learned", "priority": 1000, "retraining": {"minNewExperience": 6}},
        },
    )
    custom.create_namespaced_custom_object(
        "dynamiccl.io",
        "v1alpha1",
        user_ns,
        "tuningruns",
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "TuningRun",
            "metadata": {"name": "llm-dynamiccl", "namespace": user_ns},
            "spec": {
                "jobRef": {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "llm",
                    "uid": "uid-llm",
                }
            },
        },
    )
    try:
        yield {"user_ns": user_ns, "op_ns": op_ns, "policy": pol, "tmp": tmp_path}
    finally:
        custom.delete_cluster_custom_object(
            "dynamiccl.io", "v1alpha1", "nccltuningpolicies", policy
        )
        for ns in (user_ns, op_ns):
            core.delete_namespace(ns)


def batch(seq: int, records: int = 3) -> RewardBatch:
    return RewardBatch.model_validate(
        {
            "idempotency_key": f"pod-x/{seq}",
            "job": {
                "namespace": "ignored-by-status",
                "kind": "PyTorchJob",
                "name": "llm",
                "uid": "uid-llm",
            },
            "pod": {"name": "llm-worker-0", "uid": "pod-x"},
            "model_version": "default",
            "table_version": 1,
            "records": [
                {
                    "collective": "allgather",
                    "size_bucket": 16 + i,
                    "nbytes_min": 1 << (16 + i),
                    "nbytes_max": (2 << (16 + i)) - 1,
                    "nranks": 16,
                    "nnodes": 2,
                    "algo": "ring",
                    "proto": "ll128",
                    "nchannels": 0,
                    "chunk_bytes": 0,
                    "origin": "table",
                    "count": 100,
                    "mean_time_us": 40.0,
                    "p50_time_us": 39.0,
                    "p99_time_us": 55.0,
                    "busbw_GBps": 20.0,
                    "nccl_default_time_us": 50.0,
                }
                for i in range(records)
            ],
        }
    )


def test_loop_on_the_real_apiserver(api: k8s.ApiClient, env: dict[str, Any]) -> None:
    store = open_store(str(env["tmp"] / "experience.db"))
    try:
        # the batch's job lives in the user namespace of this test
        b = batch(1).model_copy(
            update={"job": batch(1).job.model_copy(update={"namespace": env["user_ns"]})}
        )
        store.insert_batch(b)
        kube = Kube(str(_kubeconfig()))
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


def test_ingest_process_runs_the_loop(api: k8s.ApiClient, env: dict[str, Any]) -> None:
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
            "dynamiccl.operator.ingest_main",
            "--store",
            str(db),
            "--insecure-http",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--kubeconfig",
            str(_kubeconfig()),
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
    custom = k8s.CustomObjectsApi(api)
    try:
        deadline = time.monotonic() + 60
        calls = None
        while time.monotonic() < deadline and proc.poll() is None:
            tr = custom.get_namespaced_custom_object(
                "dynamiccl.io", "v1alpha1", env["user_ns"], "tuningruns", "llm-dynamiccl"
            )
            calls = ((tr.get("status") or {}).get("reward") or {}).get("calls")
            if calls:
                break
            time.sleep(0.5)
        assert calls == 300, proc.stderr.read() if proc.poll() is not None else "timeout"
    finally:
        proc.terminate()
        proc.wait(20)

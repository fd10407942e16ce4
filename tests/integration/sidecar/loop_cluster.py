"""Shared by tests/integration/sidecar/test_loop.py: the processes it runs (the ingest, the
sidecars), the job's config dir and pod-bound tokens.

Not a test module.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.testing import certs
from dynamiccl.testing.ports import free_port
from tests.topology_samples import dgx_h100

PORT_TRIES = 3  # a sidecar's metrics port taken before it bound: picked again
AUDIENCE = "dynamiccl-ingest"
PODS = 8
NODE = dgx_h100(nodes=1)


@dataclass
class Job:
    """The test's batch/v1 Job: its namespace, name, uid and (name, uid) of its pods."""

    namespace: str
    name: str
    uid: str
    pods: list[tuple[str, str]]


def name_uid(obj: k8s.V1Pod | k8s.V1Job) -> tuple[str, str]:
    """(name, uid) of an object the apiserver returned (it always sets both)."""
    meta = obj.metadata
    assert meta is not None
    assert meta.name is not None
    assert meta.uid is not None
    return meta.name, meta.uid


def mint(api: k8s.ApiClient, job: Job, pod: tuple[str, str]) -> str:
    """A ServiceAccount token of the job's pod `pod`, for the ingest's audience (TokenRequest)."""
    req = k8s.CoreV1Api(api).create_namespaced_service_account_token(
        "trainer",
        job.namespace,
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "spec": {
                "audiences": [AUDIENCE],
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": pod[0],
                    "uid": pod[1],
                },
            }
        },
    )
    assert req.status is not None
    return str(req.status.token)


class Ingest:
    """`python -m dynamiccl.operator.ingest.main` with TLS, TokenReview and the learning loop."""

    def __init__(self, store_url: str, ns: str, tls_dir: Path, kubeconfig: Path) -> None:
        self.crt, key = certs.write_self_signed(tls_dir)
        self.port = free_port()
        self.store_url = store_url
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dynamiccl.operator.ingest.main", "--store", store_url,
             "--host", "127.0.0.1", "--port", str(self.port), "--tls-cert", str(self.crt),
             "--tls-key", str(key), "--kubeconfig", str(kubeconfig),
             "--loop-namespace", ns, "--loop-image", "example.invalid/dynamiccl:test",
             "--loop-pvc", "unused", "--loop-interval", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"ingest did not start: {self.proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        self.url = f"https://127.0.0.1:{self.port}/v1/rewards"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def stored(self, job_uid: str) -> tuple[int, int]:
        from dynamiccl.operator.store.experience import open_store  # noqa: PLC0415

        s = open_store(self.store_url, migrate=False)
        try:
            return s.stored_calls(job_uid), s.batch_count()
        finally:
            s.close()


@dataclass
class Sidecar:
    """One pod's `dynamiccl sidecar` process."""

    index: int
    args: list[str]
    log: Path
    proc: subprocess.Popen[str] | None = None
    metrics_port: int = 0
    starts: int = 0
    _log_from: int = 0  # the log's size when the running process was spawned
    summary: dict[str, Any] = field(default_factory=dict)

    def launch(self) -> None:
        self.starts += 1
        self._spawn()

    def _spawn(self) -> None:
        self.metrics_port = free_port()
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        err = self.log.open("a")
        self.proc = subprocess.Popen(
            [*self.args, "--metrics-port", str(self.metrics_port)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )

    def started(self) -> None:
        """The sidecar said it started. A metrics port the kernel handed to another socket
        (an outgoing connection's ephemeral port) between `free_port` and the sidecar's bind
        is picked again, as a sidecar restarted by its kubelet would be: not a start more."""
        for _ in range(PORT_TRIES):
            assert self.proc is not None
            assert self.proc.stdout is not None
            started = json.loads(self.proc.stdout.readline() or "{}")
            if started.get("event") == "started":
                return
            self.proc.wait(10)
            with self.log.open() as f:
                f.seek(self._log_from)
                taken = "Address already in use" in f.read()
            if not taken:
                break
            self._spawn()
        raise AssertionError(self.log.read_text()[-3000:])

    def start(self) -> None:
        self.launch()
        self.started()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> dict[str, Any]:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        lines = [json.loads(x) for x in out.strip().splitlines() if x.startswith("{")]
        stopped = [x for x in lines if x.get("event") == "stopped"]
        assert stopped, (
            f"sidecar {self.index} ended without a summary: {self.log.read_text()[-3000:]}"
        )
        self.summary = stopped[-1]
        return self.summary

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        body: bytes = urllib.request.urlopen(url, timeout=10).read()
        return body.decode()


def write_config(d: Path, job: Job) -> StateFeatures:
    """The job's config dir as the webhook mounts it (features, the compiled table,
    exploration, job identity); returns the features."""
    from dynamiccl.policy.runtime.compile import compile_table  # noqa: PLC0415
    from dynamiccl.policy.train.inference import ModelError, Policy, new_policy  # noqa: PLC0415

    d.mkdir(parents=True)
    features = StateFeatures.model_validate(
        {
            "world_size": PODS,
            "gpus_per_pod": 1,
            "replicas": PODS,
            "nproc_per_node": 1,
            "scheduled": True,
            "topology": NODE,
            "environment": {"container_boundary": True, "node_gpus": 8, "pods_per_node_max": 8},
        }
    )
    spec = NCCLTuningPolicySpec.model_validate(
        # budgetPercent 100: the budget accrues with collective time (sidecar/explore_budget.py); a
        # job this short (8 000 calls) earns a window of exploration at 1 % late or never, and
        # this test is about tables agreed and used and rewards landing, not the budget
        {"mode": "learned", "exploration": {"budgetCalls": 200, "budgetPercent": 100}}
    )
    try:
        policy = Policy.load()
    except (ModelError, OSError):  # the shipped model is being retrained: an untrained one ranks
        policy = new_policy(0, hidden=32)
    table = compile_table(policy, features, spec)
    assert table.cells, "the compiled table has nothing to tune"
    (d / "features.json").write_text(features.model_dump_json())
    (d / "table.json").write_text(table.model_dump_json())
    (d / "exploration.json").write_text(
        json.dumps(
            {
                "mode": "learned",
                "policy": "test",
                "exploration": spec.exploration.model_dump(mode="json"),
                "guardrails": spec.guardrails.model_dump(mode="json"),
                "constraints": {},
                "user_constraints": {},
            }
        )
    )
    (d / "job.json").write_text(
        json.dumps(
            {
                "namespace": job.namespace,
                "name": job.name,
                "kind": "Job",
                "api_version": "batch/v1",
                "uid": job.uid,
                "policy": "test",
                "model_version": "default",
                "canary": False,
                "table_digest": "",
            }
        )
    )
    return features

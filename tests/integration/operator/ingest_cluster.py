"""Shared by the ingest integration tests: a PyTorchJob the real training operator
runs (pods on kwok nodes), the TuningRun the operator would have written for it,
pod-bound tokens (TokenRequest), and the ingest endpoint as its own process.

Not a test module: test_ingest_kube.py and test_ingest_trust.py import it.
"""

from __future__ import annotations

import base64
import http.client
import json
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kubernetes import client as k8s

from dynamiccl import constants as c
from dynamiccl.operator.controller.configmap import object_name
from dynamiccl.testing import builders, certs
from dynamiccl.testing.ports import free_port

AUDIENCE = "dynamiccl-ingest"
PT = ("kubeflow.org", "v1", "pytorchjobs")
MODEL = "v1"


@dataclass
class Kube:
    kubeconfig: Path
    api: k8s.ApiClient

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)


@dataclass
class Workload:
    namespace: str
    job: dict[str, str]  # JobRef fields
    pods: list[tuple[str, str]]  # (name, uid)


def _pod(sa: str) -> dict[str, Any]:
    """The pod template of the job's replicas: no GPUs, no token mounted (tests mint theirs)."""
    tmpl = builders.template(builders.container(gpus=0), service_account=sa)
    tmpl["spec"]["automountServiceAccountToken"] = False
    return tmpl


def tuning_run(job: dict[str, str], model: str = MODEL) -> dict[str, Any]:
    """The TuningRun the operator writes for a tuned job (operator/controller/tuningrun.py)."""
    return {
        "apiVersion": f"{c.GROUP}/{c.API_VERSION}",
        "kind": "TuningRun",
        "metadata": {"name": object_name(job["name"]), "namespace": job["namespace"]},
        "spec": {
            "jobRef": {
                "apiVersion": "kubeflow.org/v1",
                "kind": job["kind"],
                "name": job["name"],
                "uid": job["uid"],
            },
            "mode": "learned",
            "modelVersion": model,
            "configMapName": object_name(job["name"]),
        },
    }


def make_job(
    kube: Kube, ns: str, name: str, pods: int, *, sa: str = "trainer", tuned: bool = True
) -> Workload:
    """A PyTorchJob (Master + pods-1 Workers) whose pods the training operator creates;
    with `tuned`, the TuningRun DynamICCL's operator would have written for it."""
    body = builders.pytorchjob(
        name, workers=max(pods - 1, 0), pod=_pod(sa), nproc_per_node=None, restart_policy="Never"
    )
    job = kube.custom.create_namespaced_custom_object(*PT[:2], ns, PT[2], body)
    assert isinstance(job, dict)
    ref = {"namespace": ns, "kind": "PyTorchJob", "name": name, "uid": job["metadata"]["uid"]}
    if tuned:
        kube.custom.create_namespaced_custom_object(
            c.GROUP, c.API_VERSION, ns, "tuningruns", tuning_run(ref)
        )
    deadline = time.monotonic() + 60
    selector = f"training.kubeflow.org/job-name={name}"
    while time.monotonic() < deadline:
        items = kube.core.list_namespaced_pod(ns, label_selector=selector).items
        if len(items) >= pods:
            items.sort(key=lambda p: name_uid(p)[0])  # <job>-master-0 first
            return Workload(ns, ref, [name_uid(p) for p in items[:pods]])
        time.sleep(0.3)
    pytest.fail(f"the training operator did not create {pods} pods for {ns}/{name} in 60 s")


def name_uid(obj: k8s.V1Pod) -> tuple[str, str]:
    """(name, uid) of an object the apiserver returned (it always sets both)."""
    meta = obj.metadata
    assert meta is not None
    assert meta.name is not None
    assert meta.uid is not None
    return meta.name, meta.uid


def make_namespace(kube: Kube, ns: str, *accounts: str) -> None:
    kube.core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    for sa in accounts or ("trainer",):
        kube.core.create_namespaced_service_account(
            ns,
            {"metadata": {"name": sa}},  # type: ignore[arg-type]  # the client takes dict bodies
        )


def mint(
    kube: Kube, ns: str, pod: tuple[str, str], audience: str = AUDIENCE, sa: str = "trainer"
) -> str:
    req = kube.core.create_namespaced_service_account_token(
        sa,
        ns,
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "spec": {
                "audiences": [audience],
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


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_jwt(
    claims: dict[str, Any],
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey,
    kid: str | None = None,
) -> str:
    """A JWT signed as kube-apiserver would: RS256 for RSA keys, ES256 (raw r||s) for P-256."""
    alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
    header: dict[str, str] = {"alg": alg, "typ": "JWT"}
    if kid:
        header["kid"] = kid
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    if isinstance(key, rsa.RSAPrivateKey):
        sig = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return f"{signing_input}.{_b64(sig)}"


def claims_of(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))  # type: ignore[no-any-return]


def header_of(token: str) -> dict[str, Any]:
    part = token.split(".", maxsplit=1)[0]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))  # type: ignore[no-any-return]


# --- ingest process ---------------------------------------------------------------


class IngestProcess:
    def __init__(self, store_url: str, kube: Kube, tls_dir: Path) -> None:
        self.crt, self.key = certs.write_self_signed(tls_dir)
        self.store_url = store_url
        self.kube = kube
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.ctx = ssl.create_default_context(cafile=str(self.crt))

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dynamiccl.operator.ingest.main",
                "--store",
                self.store_url,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--tls-cert",
                str(self.crt),
                "--tls-key",
                str(self.key),
                "--kubeconfig",
                str(self.kube.kubeconfig),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            pytest.fail(f"ingest process did not start: {err[-2000:]}")
        assert json.loads(line)["port"] == self.port

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def post(self, body: bytes | dict[str, Any], token: str | None) -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
        try:
            conn.request("POST", "/v1/rewards", body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        return resp.status, json.loads(raw) if raw else {}


def record(i: int, count: int = 10) -> dict[str, Any]:
    return {
        "collective": "allreduce",
        "size_bucket": 12 + i,
        "nbytes_min": 1 << (12 + i),
        "nbytes_max": (2 << (12 + i)) - 1,
        "nranks": 2,
        "nnodes": 1,
        "algo": "ring",
        "proto": "ll128",
        "nchannels": 4,
        "chunk_bytes": 0,
        "origin": "table",
        "count": count,
        "mean_time_us": 30.0,
        "p50_time_us": 29.0,
        "p99_time_us": 40.0,
        "busbw_GBps": 5.0,
        "nccl_default_time_us": 33.0,
    }


def batch(w: Workload, pod: int, seq: int, n: int = 3, count: int = 10) -> dict[str, Any]:
    name, uid = w.pods[pod]
    return {
        "idempotency_key": f"{uid}/{seq}",
        "job": w.job,
        "pod": {"name": name, "uid": uid},
        "model_version": MODEL,
        "table_version": 1,
        "records": [record(i, count) for i in range(n)],
    }


def stored(ingest: IngestProcess) -> tuple[int, int]:
    """(experience rows, batches) as another process (a reader) sees them."""
    from dynamiccl.operator.store.experience import open_store  # noqa: PLC0415

    s = open_store(ingest.store_url, migrate=False)
    try:
        return s.count_experience(), s.batch_count()
    finally:
        s.close()


def expect_rejected(
    ingest: IngestProcess,
    body: bytes | dict[str, Any],
    token: str | None,
    status: int | tuple[int, ...],
) -> dict[str, Any]:
    before = stored(ingest)
    got, resp = ingest.post(body, token)
    assert got in (status if isinstance(status, tuple) else (status,)), resp
    assert stored(ingest) == before, "a rejected request wrote something"
    return resp

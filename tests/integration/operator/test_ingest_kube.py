"""Reward ingest against a REAL kube-apiserver (TokenReview, TokenRequest, owner chains).

The ingest endpoint runs as its own process (`python -m dynamiccl.operator.ingest.main`)
over HTTPS with a self-signed certificate. Pods are created by the real Job
controller (kube-controller-manager) for batch/v1 Jobs; sidecar tokens are
minted with TokenRequest, bound to those pods, audience `dynamiccl-ingest`.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
Needs kube-apiserver and kube-controller-manager; no nodes, no kubelet (pods
stay Pending, which is enough for pod-bound tokens).
"""

from __future__ import annotations

import base64
import http.client
import json
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pg_server  # hack/ (on sys.path via tests/conftest.py)
import pytest
import selfsigned_cert as certs  # hack/ (on sys.path via tests/conftest.py)
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kubernetes import client as k8s

ROOT = Path(__file__).resolve().parents[3]
AUDIENCE = "dynamiccl-ingest"


# --- cluster ---------------------------------------------------------------------
@dataclass
class Kube:
    kubeconfig: Path
    api: k8s.ApiClient

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)


@pytest.fixture(scope="module")
def kube(cluster_kubeconfig: Path, admin_api: k8s.ApiClient) -> Kube:
    return Kube(cluster_kubeconfig, admin_api)


@dataclass
class Workload:
    namespace: str
    job: dict[str, str]  # JobRef fields
    pods: list[tuple[str, str]]  # (name, uid)


def _make_job(kube: Kube, ns: str, name: str, pods: int) -> Workload:
    batch = k8s.BatchV1Api(kube.api)
    job = batch.create_namespaced_job(
        ns,
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "template": {
                    "spec": {
                        "serviceAccountName": "trainer",
                        "automountServiceAccountToken": False,
                        "restartPolicy": "Never",
                        "containers": [{"name": "train", "image": "example.invalid/train:1"}],
                    }
                },
            },
        },
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        items = kube.core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
        if len(items) >= pods:
            return Workload(
                ns,
                {"namespace": ns, "kind": "Job", "name": name, "uid": _name_uid(job)[1]},
                [_name_uid(p) for p in items[:pods]],
            )
        time.sleep(0.3)
    pytest.fail(f"the Job controller did not create {pods} pods for {ns}/{name} in 60 s")


def _name_uid(obj: k8s.V1Pod | k8s.V1Job) -> tuple[str, str]:
    """(name, uid) of an object the apiserver returned (it always sets both)."""
    meta = obj.metadata
    assert meta is not None
    assert meta.name is not None
    assert meta.uid is not None
    return meta.name, meta.uid


@pytest.fixture(scope="module")
def workloads(kube: Kube) -> Iterator[dict[str, Workload]]:
    suffix = uuid.uuid4().hex[:6]
    names = {"a": f"ingest-a-{suffix}", "b": f"ingest-b-{suffix}"}
    for ns in names.values():
        kube.core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
        kube.core.create_namespaced_service_account(
            ns,
            {"metadata": {"name": "trainer"}},  # type: ignore[arg-type]  # the client takes dict bodies
        )
    try:
        yield {
            "llm": _make_job(kube, names["a"], "llm", 2),
            "other": _make_job(kube, names["a"], "other", 1),
            "b": _make_job(kube, names["b"], "llm", 1),
        }
    finally:
        for ns in names.values():
            kube.core.delete_namespace(ns, propagation_policy="Background")


def mint(kube: Kube, ns: str, pod: tuple[str, str], audience: str = AUDIENCE) -> str:
    req = kube.core.create_namespaced_service_account_token(
        "trainer",
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
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        "model_version": "v1",
        "table_version": 1,
        "records": [record(i, count) for i in range(n)],
    }


@pytest.fixture(scope="module")
def ingest(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IngestProcess]:
    tmp = tmp_path_factory.mktemp("ingest-kube")
    p = IngestProcess(f"sqlite:///{tmp / 'experience.db'}", kube, tmp / "tls")
    p.start()
    yield p
    p.stop()


def stored(ingest: IngestProcess) -> tuple[int, int]:
    """(experience rows, batches) as another process (a reader) sees them."""
    from dynamiccl.operator.store.experience import open_store  # noqa: PLC0415

    s = open_store(ingest.store_url, migrate=False)
    try:
        return s.count_experience(), s.batch_count()
    finally:
        s.close()


def test_own_pod_token_is_accepted_and_retries_never_double_count(
    kube: Kube, workloads: dict[str, Workload], ingest: IngestProcess
) -> None:
    w = workloads["llm"]
    before = stored(ingest)
    for pod in (0, 1):
        tok = mint(kube, w.namespace, w.pods[pod])
        b = batch(w, pod, seq=1)
        assert ingest.post(b, tok) == (200, {"accepted": 3, "duplicate": False})
        assert ingest.post(b, tok) == (200, {"accepted": 0, "duplicate": True})
    assert stored(ingest) == (before[0] + 6, before[1] + 2)


def expect_rejected(
    ingest: IngestProcess, body: bytes | dict[str, Any], token: str | None, status: int
) -> dict[str, Any]:
    before = stored(ingest)
    got, resp = ingest.post(body, token)
    assert got == status, resp
    assert stored(ingest) == before, "a rejected request wrote something"
    return resp


def test_token_from_another_namespace_is_403(
    kube: Kube, workloads: dict[str, Workload], ingest: IngestProcess
) -> None:
    a, b = workloads["llm"], workloads["b"]
    tok_b = mint(kube, b.namespace, b.pods[0])
    resp = expect_rejected(ingest, batch(a, 0, seq=50), tok_b, 403)
    assert "namespace" in resp["detail"]
    # B's own pod, but claiming A's job
    forged = batch(b, 0, seq=51) | {"job": a.job}
    expect_rejected(ingest, forged, tok_b, 403)


def test_report_for_another_job_is_403(
    kube: Kube, workloads: dict[str, Workload], ingest: IngestProcess
) -> None:
    llm, other = workloads["llm"], workloads["other"]
    tok = mint(kube, other.namespace, other.pods[0])
    body = batch(other, 0, seq=60) | {"job": llm.job}
    resp = expect_rejected(ingest, body, tok, 403)
    assert "belongs to Job 'other'" in resp["detail"]
    # another pod's name with this pod's token (same job, same namespace)
    tok_w0 = mint(kube, llm.namespace, llm.pods[0])
    expect_rejected(ingest, batch(llm, 1, seq=61), tok_w0, 403)
    # and its own report is fine: the 403s above were about the job, not the token
    assert ingest.post(batch(other, 0, seq=62), tok)[0] == 200


def test_missing_wrong_audience_and_forged_tokens_are_401(
    kube: Kube, workloads: dict[str, Workload], ingest: IngestProcess
) -> None:
    w = workloads["llm"]
    body = batch(w, 0, seq=70)
    expect_rejected(ingest, body, None, 401)
    expect_rejected(ingest, body, mint(kube, w.namespace, w.pods[0], audience="other"), 401)
    real = mint(kube, w.namespace, w.pods[0])
    rogue = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = sign_jwt(claims_of(real), rogue, header_of(real).get("kid"))
    expect_rejected(ingest, body, forged, 401)
    tampered = real[:-8] + ("A" * 8 if not real.endswith("A" * 8) else "B" * 8)
    expect_rejected(ingest, body, tampered, 401)
    assert ingest.post(body, real)[0] == 200  # control: the genuine token works


def test_expired_token_is_401(
    kube: Kube, workloads: dict[str, Workload], ingest: IngestProcess
) -> None:
    sa_key_path = kube.kubeconfig.parent / "pki" / "sa.key"
    if not sa_key_path.is_file():
        pytest.skip("needs the local control plane's signing key to mint an expired token")
    key = serialization.load_pem_private_key(sa_key_path.read_bytes(), password=None)
    assert isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey))
    w = workloads["llm"]
    real = mint(kube, w.namespace, w.pods[1])
    kid = header_of(real).get("kid")
    now = int(time.time())
    expired = claims_of(real) | {
        "iat": now - 7200,
        "nbf": now - 7200,
        "exp": now - 3600,
        "jti": str(uuid.uuid4()),
    }
    expect_rejected(ingest, batch(w, 1, seq=80), sign_jwt(expired, key, kid), 401)
    # control: the same claims, minted the same way but not expired, are accepted
    fresh = expired | {"iat": now, "nbf": now, "exp": now + 600, "jti": str(uuid.uuid4())}
    assert ingest.post(batch(w, 1, seq=81), sign_jwt(fresh, key, kid))[0] == 200


def test_token_of_a_deleted_pod_is_401(
    kube: Kube, workloads: dict[str, Workload], ingest: IngestProcess
) -> None:
    w = _make_job(kube, workloads["llm"].namespace, f"gone-{uuid.uuid4().hex[:4]}", 1)
    tok = mint(kube, w.namespace, w.pods[0])
    kube.core.delete_namespaced_pod(w.pods[0][0], w.namespace, grace_period_seconds=0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            kube.core.read_namespaced_pod(w.pods[0][0], w.namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                break
        time.sleep(0.2)
    expect_rejected(ingest, batch(w, 0, seq=1), tok, 401)


def test_oversized_and_malformed_payloads_write_nothing(
    kube: Kube, workloads: dict[str, Workload], ingest: IngestProcess
) -> None:
    w = workloads["llm"]
    tok = mint(kube, w.namespace, w.pods[0])
    expect_rejected(ingest, b"{" + b" " * (600 * 1024) + b"}", tok, 413)
    expect_rejected(ingest, b"{not json", tok, 422)
    bad = batch(w, 0, seq=90)
    bad["records"][1]["p50_time_us"] = 1e9  # p50 above p99: the whole batch is refused
    expect_rejected(ingest, bad, tok, 422)
    expect_rejected(ingest, batch(w, 0, seq=91) | {"extra": True}, tok, 422)


# --- crash consistency --------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def crash_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'crash.db'}"
        return
    if not pg_server.available():
        pytest.fail("PostgreSQL binaries missing: apt-get install postgresql-15 (or set PG_BIN)")
    with pg_server.PgServer() as pg:
        yield pg.url


def test_operator_killed_during_ingest_sent_equals_stored(
    kube: Kube, workloads: dict[str, Workload], crash_store: str, tmp_path: Path
) -> None:
    """kill -9 the ingest process 3 times while 2 sidecars send; they retry; nothing lost."""
    w = workloads["llm"]
    proc = IngestProcess(crash_store, kube, tmp_path / "tls")
    proc.start()
    tokens = [mint(kube, w.namespace, p) for p in w.pods]
    per_sender, sent_calls = 120, [0, 0]
    answers: list[list[dict[str, Any]]] = [[], []]
    done = threading.Event()
    seq_base = int(time.time() * 1000)

    def sender(i: int) -> None:
        for k in range(per_sender):
            b = batch(w, i, seq=seq_base + k, n=5, count=k + 1)
            while True:  # retry the SAME batch until the operator answers 200
                try:
                    status, resp = proc.post(b, tokens[i])
                except (OSError, http.client.HTTPException):
                    status, resp = 0, {}
                if status == 200:
                    answers[i].append(resp)
                    break
                assert status in (0, 503), resp
                time.sleep(0.05)
            sent_calls[i] += sum(r["count"] for r in b["records"])

    threads = [threading.Thread(target=sender, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    kills = 0
    try:
        # Kill at fixed points of progress (a quarter, half, three quarters of the batches
        # answered), not on a clock: a fast machine must not finish before the kills.
        while kills < 3 and any(t.is_alive() for t in threads):
            if len(answers[0]) + len(answers[1]) < (kills + 1) * 2 * per_sender // 4:
                time.sleep(0.01)
                continue
            proc.kill9()
            kills += 1
            time.sleep(0.3)
            proc.start()
        for t in threads:
            t.join(300)
        done.set()
    finally:
        proc.stop()
    assert kills == 3
    assert all(len(a) == per_sender for a in answers)
    from dynamiccl.operator.store.experience import open_store  # noqa: PLC0415

    s = open_store(crash_store, migrate=False)
    try:
        assert s.batch_count() == 2 * per_sender
        assert s.count_experience() == 2 * per_sender * 5
        assert s.stored_calls(w.job["uid"]) == sum(sent_calls)
        accepted = sum(a["accepted"] for ans in answers for a in ans)
        duplicates = sum(a["duplicate"] for ans in answers for a in ans)
        # every batch stored once: accepted now, or earlier by a request whose answer was lost
        assert accepted + 5 * duplicates == 2 * per_sender * 5
    finally:
        s.close()

"""Reward ingest against a REAL kube-apiserver (TokenReview, TokenRequest, owner chains).

The ingest endpoint runs as its own process (`python -m dynamiccl.operator.ingest.main`)
over HTTPS with a self-signed certificate. Pods are created by the real training
operator for PyTorchJobs (on kwok nodes), each job has the TuningRun DynamICCL's
operator would have written; sidecar tokens are minted with TokenRequest, bound to
those pods, audience `dynamiccl-ingest`. Forged jobs, pods and model versions:
test_ingest_trust.py.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import http.client
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from kubernetes import client as k8s

from dynamiccl.testing import postgres as pg_server
from tests.integration.operator.ingest_cluster import (
    AUDIENCE,
    IngestProcess,
    Kube,
    Workload,
    batch,
    claims_of,
    expect_rejected,
    header_of,
    make_job,
    make_namespace,
    mint,
    sign_jwt,
    stored,
)


@pytest.fixture(scope="module")
def kube(cluster_kubeconfig: Path, api: k8s.ApiClient) -> Kube:
    return Kube(cluster_kubeconfig, api)


@pytest.fixture(scope="module")
def workloads(kube: Kube) -> Iterator[dict[str, Workload]]:
    suffix = uuid.uuid4().hex[:6]
    names = {"a": f"ingest-a-{suffix}", "b": f"ingest-b-{suffix}"}
    for ns in names.values():
        make_namespace(kube, ns)
    try:
        yield {
            "llm": make_job(kube, names["a"], "llm", 2),
            "other": make_job(kube, names["a"], "other", 1),
            "b": make_job(kube, names["b"], "llm", 1),
        }
    finally:
        for ns in names.values():
            kube.core.delete_namespace(ns, propagation_policy="Background")


@pytest.fixture(scope="module")
def ingest(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IngestProcess]:
    tmp = tmp_path_factory.mktemp("ingest-kube")
    p = IngestProcess(f"sqlite:///{tmp / 'experience.db'}", kube, tmp / "tls")
    p.start()
    yield p
    p.stop()


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
    assert "belongs to PyTorchJob 'other'" in resp["detail"]
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
    w = make_job(kube, workloads["llm"].namespace, f"gone-{uuid.uuid4().hex[:4]}", 1)
    tok = mint(kube, w.namespace, w.pods[0])
    kube.core.delete_namespaced_pod(w.pods[0][0], w.namespace, grace_period_seconds=0)
    # the apiserver checks a bound token's pod in its informer cache, which sees the
    # deletion a moment after a read does (longer on a loaded machine): until then the token
    # still authenticates and the ingest's answer is the pod lookup's 403, not 401. Wait
    # until the apiserver itself refuses the token: from then on 401 is the right answer.
    auth = k8s.AuthenticationV1Api(kube.api)
    review = {"spec": {"token": tok, "audiences": [AUDIENCE]}}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = auth.create_token_review(review).status  # type: ignore[arg-type]  # dict body
        if status is None or not status.authenticated:
            break
        time.sleep(0.2)
    expect_rejected(ingest, batch(w, 0, seq=1), tok, 401)


def test_oversized_and_malformed_payloads_write_nothing(
    kube: Kube, workloads: dict[str, Workload], ingest: IngestProcess
) -> None:
    w = workloads["llm"]
    tok = mint(kube, w.namespace, w.pods[0])
    expect_rejected(ingest, b"{" + b" " * (600 * 1024) + b"}", tok, 413)
    expect_rejected(ingest, b"{not json", tok, 415)  # docs/security.md: not JSON
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

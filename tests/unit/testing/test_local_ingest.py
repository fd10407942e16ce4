"""The demo's ingest: real HTTPS, handler and store; only the API-server lookups are local."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.rewards import JobRef, PodRef, RewardBatch, RewardRecord
from dynamiccl.testing import builders
from dynamiccl.testing.auth import TokenIssuer
from dynamiccl.testing.local_ingest import IngestService

_JOB = builders.pytorchjob("job", namespace="ml-team", uid="job-uid")

POD = builders.pod_of(_JOB, 0, replica="Master", uid="pod-uid-1")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[IngestService, TokenIssuer]]:
    issuer = TokenIssuer(b"k" * 32)
    svc = IngestService(tmp_path / "ingest", tmp_path / "store.sqlite", issuer)
    svc.resolver.add_pod(POD)
    try:
        yield svc, issuer
    finally:
        svc.close()


def _batch(seq: int, pod_uid: str = "pod-uid-1") -> RewardBatch:
    rec = RewardRecord.model_validate(
        {
            "collective": "allreduce",
            "size_bucket": 12,
            "nbytes_min": 6144,
            "nbytes_max": 6144,
            "nranks": 16,
            "nnodes": 2,
            "algo": "tree",
            "proto": "ll128",
            "nchannels": 0,
            "chunk_bytes": 0,
            "origin": "table",
            "count": 10,
            "mean_time_us": 96.0,
            "p50_time_us": 95.0,
            "p99_time_us": 99.0,
            "busbw_GBps": 0.1,
            "nccl_default_time_us": 117.0,
        }
    )
    return RewardBatch(
        idempotency_key=f"{pod_uid}/{seq}",
        job=JobRef(namespace="ml-team", kind="PyTorchJob", name="job", uid="job-uid"),
        pod=PodRef(name="job-master-0", uid=pod_uid),
        model_version="default",
        table_version=1,
        records=(rec,),
    )


def _post(svc: IngestService, body: bytes, token: str | None) -> tuple[int, dict[str, Any]]:
    ctx = ssl.create_default_context(cadata=svc.ca_pem)
    conn = http.client.HTTPSConnection("127.0.0.1", svc.port, context=ctx, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("POST", "/v1/rewards", body=body, headers=headers)
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read() or b"{}")
    conn.close()
    return out


def test_a_pod_token_stores_its_batch_once(service: tuple[IngestService, TokenIssuer]) -> None:
    svc, issuer = service
    assert svc.url == f"https://127.0.0.1:{svc.port}/v1/rewards"
    token = issuer.issue("ml-team", "default", "job-master-0", "pod-uid-1")
    body = _batch(1).model_dump_json().encode()
    assert _post(svc, body, token) == (200, {"accepted": 1, "duplicate": False})
    assert _post(svc, body, token) == (200, {"accepted": 0, "duplicate": True})
    assert svc.store.count_experience() == 1
    assert svc.counter("dynamiccl_ingest_records_total") == 1
    assert svc.counter("dynamiccl_ingest_duplicate_batches_total") == 1


def test_the_ingest_refuses_what_a_cluster_would(
    service: tuple[IngestService, TokenIssuer],
) -> None:
    svc, issuer = service
    body = _batch(1).model_dump_json().encode()
    assert _post(svc, body, None)[0] == 401
    assert (
        _post(svc, body, TokenIssuer(b"x" * 32).issue("ml-team", "d", "job-master-0", "pod-uid-1"))[
            0
        ]
        == 401
    )
    other_pod = issuer.issue("ml-team", "default", "job-worker-0", "pod-uid-2")
    assert _post(svc, body, other_pod)[0] == 403
    wrong_ns = issuer.issue("other", "default", "job-master-0", "pod-uid-1")
    assert _post(svc, body, wrong_ns)[0] == 403
    token = issuer.issue("ml-team", "default", "job-master-0", "pod-uid-1")
    assert _post(svc, b'{"not": "a batch"}', token)[0] == 422
    assert svc.store.count_experience() == 0

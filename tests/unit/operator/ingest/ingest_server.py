"""The ingest endpoint over real HTTPS for the ingest's unit tests (test_app.py, test_ratelimit.py).

`Server` runs the operator's ingest service (the `running_ingest` fixture of
tests/unit/operator/conftest.py) with the API server replaced at our own interface layer
(`TokenReviewer`, `PodJobResolver`) by `FakeKube`, a table of tokens and pods; `payload`
and `record` build reward batches.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from dynamiccl.api.rewards import JobRef
from dynamiccl.operator.ingest.auth import AuthBackendUnavailable, Caller

ROOT = Path(__file__).resolve().parents[4]
NS = "team-a"
JOB = {"namespace": NS, "kind": "PyTorchJob", "name": "llm", "uid": "job-1"}
OTHER_JOB = {"namespace": NS, "kind": "PyTorchJob", "name": "other", "uid": "job-2"}


def sa(ns: str, pod: str | None, uid: str | None) -> Caller:
    return Caller(f"system:serviceaccount:{ns}:default", ns, "default", pod, uid)


class FakeKube:
    """Tokens and pods as a table; `down` simulates an unreachable API server."""

    def __init__(self) -> None:
        self.tokens: dict[str, Caller] = {
            "tok-w0": sa(NS, "llm-worker-0", "pod-0"),
            "tok-w1": sa(NS, "llm-worker-1", "pod-1"),
            "tok-other-ns": sa("team-b", "x-0", "pod-b"),
            "tok-unbound": sa(NS, None, None),
            "tok-orphan": sa(NS, "orphan", "pod-9"),
        }
        self.pods = {
            (NS, "llm-worker-0", "pod-0"): JobRef.model_validate(JOB),
            (NS, "llm-worker-1", "pod-1"): JobRef.model_validate(JOB),
            ("team-b", "x-0", "pod-b"): JobRef.model_validate({**JOB, "namespace": "team-b"}),
        }
        self.down = False

    async def review(self, token: str, audience: str) -> Caller | None:
        if self.down:
            raise AuthBackendUnavailable("apiserver down")
        return self.tokens.get(token) if audience == "dynamiccl-ingest" else None

    async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
        return self.pods.get((namespace, pod_name, pod_uid))


class Server:
    def __init__(self, tmp: Path, running_ingest: Any) -> None:
        self.kube = FakeKube()
        self.run = running_ingest(tmp, self.kube)
        self.svc, self.port, self.ctx, self.crt = (
            self.run.svc,
            self.run.port,
            self.run.ctx,
            self.run.crt,
        )

    def post(
        self, body: bytes | dict[str, Any], token: str | None = "tok-w0", **headers: str
    ) -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", **headers}
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
        try:
            conn.request("POST", "/v1/rewards", body=data, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        return resp.status, json.loads(raw) if raw else {}

    def get(self, path: str) -> str:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
        try:
            conn.request("GET", path)
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def stored(self) -> int:
        n: int = self.svc.store.count_experience()
        return n

    def stop(self) -> None:
        self.run.stop()


_seq = iter(range(1, 10**9))


def record(i: int = 0, **over: Any) -> dict[str, Any]:
    r = {
        "collective": "allreduce",
        "size_bucket": 10 + i,
        "nbytes_min": 1 << (10 + i),
        "nbytes_max": (2 << (10 + i)) - 1,
        "nranks": 16,
        "nnodes": 2,
        "algo": "ring",
        "proto": "simple",
        "nchannels": 0,
        "chunk_bytes": 0,
        "origin": "table",
        "count": 10,
        "mean_time_us": 50.0,
        "p50_time_us": 49.0,
        "p99_time_us": 60.0,
        "busbw_GBps": 10.0,
        "nccl_default_time_us": 55.0,
    }
    r.update(over)
    return r


def payload(
    n: int = 2,
    *,
    pod: str = "llm-worker-0",
    uid: str = "pod-0",
    job: dict[str, Any] = JOB,
    seq: int | None = None,
) -> dict[str, Any]:
    return {
        "idempotency_key": f"{uid}/{next(_seq) if seq is None else seq}",
        "job": job,
        "pod": {"name": pod, "uid": uid},
        "model_version": "v1",
        "table_version": 3,
        "records": [record(i) for i in range(n)],
    }

"""The sender against a scripted HTTPS endpoint: acknowledgements, retries, refusals, tokens."""

from __future__ import annotations

import importlib.util
import json
import ssl
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.sender import Client, SendLoop
from dynamiccl.sidecar.spool import Spool

ROOT = Path(__file__).resolve().parents[3]


def _certs() -> ModuleType:
    name = "dynamiccl_hack_selfsigned_cert"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "hack" / "selfsigned_cert.py")
        assert spec is not None
        assert spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


class Endpoint:
    """Answers POSTs from a script of (status, body, headers); records what it got."""

    def __init__(self, tls_dir: Path) -> None:
        self.script: list[tuple[int, dict[str, Any], dict[str, str]]] = []
        self.got: list[tuple[str, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((self.headers.get("Authorization", ""), body))
                status, doc, headers = (
                    outer.script.pop(0)
                    if outer.script
                    else (200, {"accepted": 1, "duplicate": False}, {})
                )
                raw = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.crt, key = _certs().write_self_signed(tls_dir)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.crt), str(key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/v1/rewards"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    ep = Endpoint(tmp_path / "tls")
    yield ep
    ep.close()


def batch(seq: int, calls: int = 5) -> bytes:
    rec = {
        "collective": "allreduce",
        "size_bucket": 20,
        "nbytes_min": 1 << 20,
        "nbytes_max": 1 << 20,
        "nranks": 8,
        "nnodes": 1,
        "algo": "ring",
        "proto": "simple",
        "nchannels": 0,
        "chunk_bytes": 0,
        "origin": "table",
        "count": calls,
        "mean_time_us": 10.0,
        "p50_time_us": 10.0,
        "p99_time_us": 11.0,
        "busbw_GBps": 100.0,
        "nccl_default_time_us": 12.0,
    }
    doc = {
        "idempotency_key": f"pod-u/{seq}",
        "job": {"namespace": "ns", "kind": "PyTorchJob", "name": "llm", "uid": "job-u"},
        "pod": {"name": "llm-0", "uid": "pod-u"},
        "model_version": "default",
        "table_version": 0,
        "records": [rec],
    }
    return RewardBatch.model_validate(doc).model_dump_json().encode()


def loop(tmp_path: Path, ep: Endpoint, token: Path) -> tuple[SendLoop, Spool, AgentMetrics]:
    spool = Spool(tmp_path / "spool", "pod-u")
    metrics = AgentMetrics()
    client = Client(ep.url, token, ep.crt)
    return SendLoop(spool, client, metrics, sleep=lambda _s: False), spool, metrics


def test_every_batch_is_sent_once_in_order_with_the_current_token(
    tmp_path: Path, endpoint: Endpoint
) -> None:
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    sl, spool, metrics = loop(tmp_path, endpoint, token)
    for s in (1, 2):
        spool.put_batch(s, batch(s, calls=3 * s))
    assert sl.send_one(1) is not None
    token.write_text("tok-2")  # the kubelet rotated the projected token
    assert sl.drain()
    assert [a for a, _ in endpoint.got] == ["Bearer tok-1", "Bearer tok-2"]
    assert [json.loads(b)["idempotency_key"] for _, b in endpoint.got] == ["pod-u/1", "pod-u/2"]
    assert (spool.sent().batches, spool.sent().calls) == (2, 9)
    assert metrics.acked_calls._value.get() == 9


def test_unavailable_and_unauthorized_are_retried_with_the_same_bytes(
    tmp_path: Path, endpoint: Endpoint
) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    sl, spool, _ = loop(tmp_path, endpoint, token)
    body = batch(7)
    spool.put_batch(7, body)
    endpoint.script = [
        (503, {"error": "unavailable"}, {"Retry-After": "1"}),
        (401, {"error": "unauthorized"}, {}),
        (200, {"accepted": 0, "duplicate": True}, {}),
    ]
    delays: list[float] = []
    sl._sleep = lambda s: delays.append(s) or False  # type: ignore[func-returns-value]
    assert sl.drain()
    assert [b for _, b in endpoint.got] == [body, body, body]
    assert len(delays) == 2
    assert 1.0 <= delays[0] <= 1.25  # never before Retry-After, spread a little past it
    assert spool.sent().batches == 1  # a duplicate answer acknowledges (stored earlier)


def test_a_refused_batch_is_parked_and_the_next_one_goes_on(
    tmp_path: Path, endpoint: Endpoint
) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    sl, spool, metrics = loop(tmp_path, endpoint, token)
    spool.put_batch(1, batch(1))
    spool.put_batch(2, batch(2))
    endpoint.script = [(422, {"error": "invalid", "detail": "records.0"}, {})]
    assert sl.drain()
    assert spool.outbox() == []
    assert (tmp_path / "spool" / "rejected" / f"{1:016d}.json").exists()
    assert spool.sent().batches == 1
    assert metrics.batches_rejected.labels(code="422")._value.get() == 1


def test_no_endpoint_is_a_retryable_failure_until_the_deadline(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    spool = Spool(tmp_path / "spool", "pod-u")
    spool.put_batch(1, batch(1))
    client = Client("https://127.0.0.1:9/v1/rewards", token, None, timeout_s=1)
    sl = SendLoop(spool, client, AgentMetrics(), sleep=lambda _s: False)
    assert not sl.drain(deadline=0.0)  # the first retry would be past the deadline
    assert spool.outbox() == [1]
    assert sl.last_error.startswith("0 ")
    missing = Client("https://127.0.0.1:9/v1/rewards", tmp_path / "absent", None)
    assert missing.post(b"{}").status == 0
    (tmp_path / "empty").write_text("")
    empty = Client("https://127.0.0.1:9/v1/rewards", tmp_path / "empty", None)
    assert "empty" in empty.post(b"{}").detail


def test_a_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="ingest URL"):
        Client("ftp://x/y", Path("t"), None)


def test_retry_after_is_obeyed_and_stretches_the_cut_interval(
    tmp_path: Path, endpoint: Endpoint
) -> None:
    """An ingest over capacity answers 503 / 429 with Retry-After: no retry comes earlier,
    the sidecar cuts its batches further apart, and every batch is stored in the end."""
    token = tmp_path / "token"
    token.write_text("t")
    sl, spool, _ = loop(tmp_path, endpoint, token)
    before = sl.pace.interval()
    for seq in (1, 2):
        spool.put_batch(seq, batch(seq))
    endpoint.script = [
        (503, {"error": "overloaded"}, {"Retry-After": "3"}),
        (429, {"error": "rate_limited"}, {"Retry-After": "7"}),
        (503, {"error": "overloaded"}, {"Retry-After": "1"}),
    ]
    delays: list[float] = []
    sl._sleep = lambda s: delays.append(s) or False  # type: ignore[func-returns-value]
    assert sl.drain()
    asked = [3.0, 7.0, 1.0]
    assert len(delays) == 3
    assert all(a <= d <= a * 1.25 for a, d in zip(asked, delays, strict=True)), delays
    assert spool.sent().batches == 2
    assert spool.outbox() == []
    stretched = sl.pace.interval()
    assert stretched >= 7.0 > before  # at least the longest Retry-After, relaxed by 2 acks

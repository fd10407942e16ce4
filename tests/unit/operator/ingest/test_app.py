"""The ingest endpoint over real HTTPS, with a real SQLite store.

The API server is replaced at our own interface layer (`TokenReviewer`,
`PodJobResolver`) by a table of tokens and pods; the real TokenReview path is
tests/integration/operator/test_ingest_kube.py.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamiccl.api.rewards import MAX_BATCH_BODY_BYTES
from tests.unit.operator.ingest.ingest_server import OTHER_JOB, FakeKube, Server, payload, record


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, running_ingest: Any) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("ingest"), running_ingest)
    yield s
    s.stop()


def test_accept_then_retry_is_duplicate(server: Server) -> None:
    before = server.stored()
    p = payload(3)
    assert server.post(p) == (200, {"accepted": 3, "duplicate": False})
    assert server.post(p) == (200, {"accepted": 0, "duplicate": True})
    assert server.stored() == before + 3
    p2 = dict(p, records=[record(0, count=11)])
    status, body = server.post(p2)
    assert (status, body["error"]) == (409, "conflict")
    assert server.stored() == before + 3


@pytest.mark.parametrize(
    ("token", "status"),
    [(None, 401), ("", 401), ("tok-forged", 401)],
)
def test_unauthenticated(server: Server, token: str | None, status: int) -> None:
    before = server.stored()
    headers = {"Authorization": "Bearer "} if token == "" else {}
    got, body = server.post(payload(), token=token or None, **headers)
    assert (got, body["error"]) == (status, "unauthenticated")
    assert server.stored() == before


def test_basic_auth_scheme_is_not_a_bearer_token(server: Server) -> None:
    got, _ = server.post(payload(), token=None, Authorization="Basic dG9rLXcwOg==")
    assert got == 401


@pytest.mark.parametrize(
    ("token", "body_over", "match"),
    [
        ("tok-other-ns", {}, "namespace"),
        ("tok-unbound", {}, "not bound to a pod"),
        ("tok-w1", {}, "bound to pod"),  # worker-1's token, worker-0's batch
        ("tok-orphan", {"pod": {"name": "orphan", "uid": "pod-9"}}, "no training job"),
        ("tok-w0", {"job": OTHER_JOB}, "belongs to PyTorchJob 'llm'"),
    ],
)
def test_forbidden(server: Server, token: str, body_over: dict[str, Any], match: str) -> None:
    before = server.stored()
    p = payload()
    if "pod" in body_over:
        p = payload(pod=body_over["pod"]["name"], uid=body_over["pod"]["uid"])
    if "job" in body_over:
        p["job"] = body_over["job"]
    got, body = server.post(p, token=token)
    assert got == 403, body
    assert match in body["detail"]
    assert server.stored() == before


def test_oversized_body_is_413_before_reading(server: Server) -> None:
    before = server.stored()
    got, body = server.post(b"x" * (MAX_BATCH_BODY_BYTES + 1))
    assert (got, body["error"]) == (413, "too_large")
    # a valid batch padded beyond the limit with whitespace is still refused
    big = json.dumps(payload()).encode() + b" " * MAX_BATCH_BODY_BYTES
    assert server.post(big)[0] == 413
    assert server.stored() == before


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"idempotency_key": "pod-0/1"}',
        json.dumps({**payload(), "extra": 1}).encode(),
        json.dumps(payload() | {"records": [record(0, count="5")]}).encode(),
        json.dumps(payload() | {"records": [record(0), record(0)]}).encode(),
        json.dumps(payload() | {"idempotency_key": "pod-1/5"}).encode(),
    ],
)
def test_malformed_is_422(server: Server, body: bytes) -> None:
    before = server.stored()
    got, resp = server.post(body)
    assert (got, resp["error"]) == (422, "malformed"), resp
    assert resp["detail"]
    assert server.stored() == before


def _step_rows(server: Server) -> int:
    with server.svc.store.backend.transaction(write=False) as cur:
        cur.execute("SELECT COUNT(*) FROM step_times")
        row = cur.fetchone()
    return int(row[0]) if row else 0


GOOD_STEPS: dict[str, Any] = {
    "status": "found",
    "steps": 40,
    "median_us": 19_400.0,
    "spread_us": 60.0,
}


@pytest.mark.parametrize(
    "steps",
    [
        GOOD_STEPS | {"median_us": "19400"},  # a string: no coercion
        GOOD_STEPS | {"median_us": 0.0},  # below any step
        GOOD_STEPS | {"median_us": 1e13},  # above MAX_TIME_US
        GOOD_STEPS | {"spread_us": -1.0},
        GOOD_STEPS | {"status": "none"},  # steps measured, yet no step found
        GOOD_STEPS | {"status": "faster"},
        GOOD_STEPS | {"steps": 0},  # a median of no steps
        {"status": "found", "steps": 5},  # steps without their median
        GOOD_STEPS | {"extra": 1},
    ],
)
def test_forged_step_times_are_refused_and_nothing_is_lost(
    server: Server, steps: dict[str, Any]
) -> None:
    """A batch whose step times do not validate is refused whole (422 naming `steps`):
    neither its records nor its step times are stored; the sidecar's next good batch is."""
    before, rows = server.stored(), _step_rows(server)
    got, resp = server.post(payload(2) | {"steps": steps})
    assert (got, resp["error"]) == (422, "malformed"), resp
    assert "steps" in resp["detail"]
    assert (server.stored(), _step_rows(server)) == (before, rows)
    good = payload(2) | {"steps": GOOD_STEPS}
    assert server.post(good) == (200, {"accepted": 2, "duplicate": False})
    assert server.post(good) == (200, {"accepted": 0, "duplicate": True})  # a retry
    assert (server.stored(), _step_rows(server)) == (before + 2, rows + 1)


def test_wrong_content_type_is_415(server: Server) -> None:
    got, _ = server.post(payload(), **{"Content-Type": "text/plain"})
    assert got == 415


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"idempotency_key": "pod-0/1"',  # cut short
        '{"idempotency_key": "\udcff"}'.encode("utf-8", "surrogateescape"),  # not UTF-8
    ],
)
def test_a_body_that_is_not_json_is_415(server: Server, body: bytes) -> None:
    """Issue 32: docs/security.md promises 415 for a non-JSON body; it got 422."""
    before = server.stored()
    got, resp = server.post(body)
    assert (got, resp["error"]) == (415, "unsupported_media_type"), resp
    assert server.stored() == before


def test_apiserver_down_is_503_and_nothing_stored(server: Server) -> None:
    before = server.stored()
    server.kube.down = True
    try:
        got, body = server.post(payload())
    finally:
        server.kube.down = False
    assert (got, body["error"]) == (503, "auth_unavailable")
    assert server.stored() == before


def test_concurrent_requests_are_group_committed_exactly_once(server: Server) -> None:
    before = server.stored()
    batches = [payload(2) for _ in range(30)]
    results: list[int] = []

    def send(p: dict[str, Any]) -> None:
        for _ in range(2):  # every batch sent twice, concurrently with the others
            results.append(server.post(p)[1]["accepted"])

    threads = [threading.Thread(target=send, args=(p,)) for p in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 60
    assert server.stored() == before + 60


def test_metrics_and_healthz(server: Server) -> None:
    server.post(payload(1))
    text = server.get("/metrics")
    assert 'dynamiccl_ingest_requests_total{code="200"}' in text
    assert "dynamiccl_ingest_records_total" in text
    assert 'dynamiccl_ingest_rejected_total{reason="malformed"}' in text
    assert "dynamiccl_ingest_request_duration_seconds_bucket" in text
    assert server.get("/healthz") == "ok"


# --- fuzz: never a 500, never a partial write ---------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = [*payload().keys(), "records.0", *(f"records.0.{k}" for k in record()), "steps"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    p = payload(draw(st.integers(1, 3)))
    kind = draw(st.sampled_from(["field", "drop", "bytes", "valid", "valid"]))
    if kind == "bytes":
        return draw(st.binary(max_size=400))
    if kind == "valid":  # well-formed variants: stored, duplicate, conflict or forbidden
        p["idempotency_key"] = f"pod-0/{draw(st.integers(10**8, 10**8 + 500))}"
        for r in p["records"]:
            r["count"] = draw(st.integers(1, 10**6))
            r["algo"] = draw(st.sampled_from(["ring", "tree", "nvls", "pat"]))
            r["origin"] = draw(st.sampled_from(["table", "explore", "default"]))
        if draw(st.integers(0, 9)) == 0:
            p["job"] = OTHER_JOB
        return json.dumps(p).encode()
    path = draw(st.sampled_from(_FIELDS)).split(".")
    target: Any = p
    for part in path[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last: Any = int(path[-1]) if path[-1].isdigit() else path[-1]
    if kind == "drop" and isinstance(target, dict):
        target.pop(last, None)
    else:
        target[last] = draw(_json)
    return json.dumps(p).encode()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=mutated())
def test_fuzz_never_500_never_partial(server: Server, body: bytes) -> None:
    before = server.stored()
    got, resp = server.post(body)
    assert got in {200, 403, 409, 415, 422}, (got, resp)
    after = server.stored()
    if got == 200:
        assert after - before == resp["accepted"]
        if not resp["duplicate"]:
            assert resp["accepted"] == len(json.loads(body)["records"])
    else:
        assert after == before


def test_a_store_behind_answers_503_with_retry_after_and_loses_nothing(
    tmp_path: Path, running_ingest: Any
) -> None:
    """The store commits one batch per 0.2 s (a slow disk); after 15 batches one by one (the
    ingest has learned its store's pace) 60 sidecars send at once. Those that would wait more
    than OVERLOAD_S are told 503 `overloaded` with a Retry-After of the wait, store nothing,
    and are stored once when resent. (Without the warm-up the burst could land before the
    first commit taught the pace, and nothing was refused: flaky on a fast or idle machine.)"""
    import time  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from dynamiccl.operator.ingest.writer import OVERLOAD_S  # noqa: PLC0415

    kube = FakeKube()
    run = running_ingest(tmp_path, kube, max_group=1)
    store = run.svc.writer._store

    class Slow:
        def insert_batches(self, batches: Any) -> Any:
            time.sleep(0.2)
            return store.insert_batches(batches)

    run.svc.writer._store = Slow()
    srv = Server.__new__(Server)
    srv.kube, srv.run, srv.svc, srv.port, srv.ctx = kube, run, run.svc, run.port, run.ctx

    def post(body: dict[str, Any]) -> tuple[int, str, str | None]:
        conn = http.client.HTTPSConnection("127.0.0.1", run.port, context=run.ctx, timeout=60)
        hdrs = {"Content-Type": "application/json", "Authorization": "Bearer tok-w0"}
        try:
            conn.request("POST", "/v1/rewards", body=json.dumps(body), headers=hdrs)
            resp = conn.getresponse()
            doc = json.loads(resp.read())
        finally:
            conn.close()
        return resp.status, str(doc.get("error", "")), resp.getheader("Retry-After")

    try:
        for body in [payload(2) for _ in range(15)]:
            assert post(body)[0] == 200
        bodies = [payload(2) for _ in range(60)]
        with ThreadPoolExecutor(60) as pool:
            answers = list(pool.map(post, bodies))
        refused = [i for i, (status, _, _) in enumerate(answers) if status == 503]
        assert refused, "no batch was told to come back later"
        assert all(answers[i][1] == "overloaded" for i in refused)
        assert all(int(answers[i][2] or 0) >= 1 for i in refused)  # Retry-After, seconds
        assert all(status in (200, 503) for status, _, _ in answers)
        assert srv.stored() == 2 * (15 + 60 - len(refused))
        assert run.svc.writer.backlog_s() <= OVERLOAD_S
        for i in refused:  # resent after the Retry-After (the queue has drained by now)
            assert srv.post(bodies[i]) == (200, {"accepted": 2, "duplicate": False})
        assert srv.stored() == 2 * (15 + 60)
    finally:
        run.stop()

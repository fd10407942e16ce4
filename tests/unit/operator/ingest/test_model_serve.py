"""GET /v1/models/{version}.npz on the ingest endpoint, over real HTTPS with a real SQLite store.

Auth is replaced at our interface (`TokenReviewer`) by a table of tokens, as in
test_ingest.py; the real TokenReview path is
tests/integration/operator/test_model_serve_kube.py.
"""

from __future__ import annotations

import hashlib
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynamiccl.api.rewards import JobRef
from dynamiccl.operator.controller import model_fetch as mf
from dynamiccl.operator.controller.configmap import ModelUnavailable
from dynamiccl.operator.ingest.auth import AuthBackendUnavailable, Caller
from dynamiccl.operator.ingest.cli import parse as _parse
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ, write_npz

ROOT = Path(__file__).resolve().parents[4]
OPERATOR = "system:serviceaccount:dynamiccl-system:dynamiccl-operator"


def _sa(username: str) -> Caller:
    ns, name = username.rsplit(":", 2)[-2:]
    return Caller(username, ns, name, None, None)


class FakeReviewer:
    def __init__(self) -> None:
        self.tokens = {
            "tok-operator": _sa(OPERATOR),
            "tok-other": _sa("system:serviceaccount:team-a:default"),
        }
        self.down = False

    async def review(self, token: str, audience: str) -> Caller | None:
        if self.down:
            raise AuthBackendUnavailable("apiserver down")
        return self.tokens.get(token) if audience == "dynamiccl-ingest" else None

    async def job_of_pod(self, namespace: str, pod_name: str, pod_uid: str) -> JobRef | None:
        return None


def write_version(models: Path, version: str, *, source: str | None = None) -> Path:
    """A trained version's directory: model.pt (stand-in bytes) and its model.npz export."""
    out = models / version
    out.mkdir(parents=True)
    pt = out / "model.pt"
    pt.write_bytes(f"weights of {version}".encode())
    with np.load(DEFAULT_NPZ, allow_pickle=False) as z:
        arrays = {n: z[n] for n in z.files}
    arrays["source_sha256"] = np.array(source or hashlib.sha256(pt.read_bytes()).hexdigest())
    write_npz(out / "model.npz", arrays)
    return pt


class Server:
    def __init__(self, tmp: Path, running_ingest: Any) -> None:
        self.reviewer = FakeReviewer()
        self.run = running_ingest(tmp, self.reviewer, model_readers=(OPERATOR,))
        self.svc, self.port, self.ctx, self.crt = (
            self.run.svc,
            self.run.port,
            self.run.ctx,
            self.run.crt,
        )
        self.models = tmp / "models"
        for v in ("v2", "v3"):
            pt = write_version(self.models, v)
            self.svc.registry.register(
                v, sha256=hashlib.sha256(pt.read_bytes()).hexdigest(), uri=str(pt)
            )
        # v-stale: the export is of another .pt (retrained, not re-exported)
        pt = write_version(self.models, "v-stale", source="0" * 64)
        self.svc.registry.register(
            "v-stale", sha256=hashlib.sha256(pt.read_bytes()).hexdigest(), uri=str(pt)
        )
        # v-noexport: trained before exports existed
        pt = write_version(self.models, "v-noexport")
        (pt.parent / "model.npz").unlink()
        self.svc.registry.register("v-noexport", sha256="1" * 64, uri=str(pt))

    def get(self, path: str, token: str | None = "tok-operator") -> tuple[int, bytes, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read(), resp.headers
        finally:
            conn.close()

    def stop(self) -> None:
        self.run.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, running_ingest: Any) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("models"), running_ingest)
    yield s
    s.stop()


def _error(body: bytes) -> tuple[str, str]:
    doc = json.loads(body)
    return doc["error"], doc["detail"]


def test_the_operator_gets_the_exact_export(server: Server) -> None:
    status, body, headers = server.get("/v1/models/v2.npz")
    assert status == 200
    assert body == (server.models / "v2" / "model.npz").read_bytes()
    mv = server.svc.registry.get("v2")
    assert mv is not None
    assert headers[mf.SOURCE_HEADER] == mv.sha256


@pytest.mark.parametrize("token", [None, "tok-forged"])
def test_unauthenticated_is_401(server: Server, token: str | None) -> None:
    status, body, _ = server.get("/v1/models/v2.npz", token)
    assert status == 401
    assert _error(body)[0] == "unauthenticated"


def test_another_service_account_is_403(server: Server) -> None:
    status, body, _ = server.get("/v1/models/v2.npz", "tok-other")
    assert status == 403
    assert "team-a:default" in _error(body)[1]


@pytest.mark.parametrize("version", ["v9", "default", "..%2Fx", "-x"])
def test_unknown_version_is_404(server: Server, version: str) -> None:
    status, body, _ = server.get(f"/v1/models/{version}.npz")
    assert status == 404
    assert _error(body)[0] == "not_found"


def test_no_export_is_404(server: Server) -> None:
    status, body, _ = server.get("/v1/models/v-noexport.npz")
    assert (status, _error(body)[0]) == (404, "not_exported")


def test_an_export_of_another_model_is_refused(server: Server) -> None:
    status, body, _ = server.get("/v1/models/v-stale.npz")
    assert status == 409
    err, detail = _error(body)
    assert err == "digest_mismatch"
    assert "000000000000" in detail


def test_a_corrupt_export_is_500_never_served(server: Server) -> None:
    path = server.models / "v3" / "model.npz"
    good = path.read_bytes()
    path.write_bytes(b"not a zip")
    try:
        status, body, _ = server.get("/v1/models/v3.npz")
    finally:
        path.write_bytes(good)
    assert (status, _error(body)[0]) == (500, "unreadable")


def test_apiserver_down_is_503(server: Server) -> None:
    server.reviewer.down = True
    try:
        status, _, headers = server.get("/v1/models/v2.npz")
    finally:
        server.reviewer.down = False
    assert status == 503
    assert headers["Retry-After"]


def test_no_reader_configured_means_nobody(server: Server) -> None:
    readers = server.svc.models.readers
    server.svc.models.readers = frozenset()
    try:
        status, body, _ = server.get("/v1/models/v2.npz")
    finally:
        server.svc.models.readers = readers
    assert status == 403
    assert "--model-reader" in _error(body)[1]


def test_the_compiler_fetches_through_the_real_adapter(server: Server, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-operator")
    ca = server.crt.read_text()
    comp = mf.RegistryCompiler(
        f"https://127.0.0.1:{server.port}/v1/rewards", token_file=token, ca=lambda: ca
    )
    assert comp.model("v2").source_sha256 == server.svc.registry.get("v2").sha256
    with pytest.raises(ModelUnavailable, match="HTTP 409"):
        comp.model("v-stale")
    token.write_text("tok-other")
    with pytest.raises(ModelUnavailable, match="HTTP 403"):
        comp.model("v3")


def test_model_reader_flag_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--store", "x.db", "--insecure-http"]
    assert _parse(base).model_readers == ()
    monkeypatch.setenv("DYNAMICCL_MODEL_READERS", "system:serviceaccount:a:b, ")
    got = _parse([*base, "--model-reader", OPERATOR]).model_readers
    assert got == tuple(sorted({OPERATOR, "system:serviceaccount:a:b"}))
    with pytest.raises(SystemExit):
        _parse([*base, "--model-reader", "alice"])


def test_model_requests_are_counted_by_status(server: Server) -> None:
    def count(code: str) -> float:
        value = server.svc.metrics.registry.get_sample_value(
            "dynamiccl_ingest_model_requests_total", {"code": code}
        )
        return value or 0.0

    ok, denied = count("200"), count("401")
    assert server.get("/v1/models/v3.npz")[0] == 200
    assert server.get("/v1/models/v3.npz", None)[0] == 401
    assert (count("200"), count("401")) == (ok + 1, denied + 1)
    status, body, _ = server.get("/metrics", None)
    assert status == 200
    assert b'dynamiccl_ingest_model_requests_total{code="200"}' in body

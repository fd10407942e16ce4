"""Run-time webhook TLS: rotation with optimistic concurrency, caBundle, hot reload."""

from __future__ import annotations

import asyncio
import base64
import copy
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from prometheus_client import REGISTRY

from dynamiccl.operator.kube import SECRETS, ConflictError, NotFoundError, Resource
from dynamiccl.operator.webhook import certs, serving_tls

NAMES = ("dynamiccl-webhook", "dynamiccl-webhook.ns.svc", "127.0.0.1")
CFG = serving_tls.SelfManaged(namespace="ns", secret="tls", webhook_config="mwc", names=NAMES)


class FakeKube:
    """In-memory stand-in for our ``kube.Kube`` wrapper (Secrets + one webhook config)."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.ca_bundle = ""
        self.rv = 0
        self.before_write: list[Any] = []  # callables run before the next write (races)

    def _race(self) -> None:
        pending, self.before_write = self.before_write, []
        for fn in pending:
            fn()

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        assert res == SECRETS
        try:
            return copy.deepcopy(self.secrets[(str(namespace), name)])
        except KeyError:
            raise NotFoundError(name) from None

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        self._race()
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.secrets:
            raise ConflictError(meta["name"])
        self.rv += 1
        obj = copy.deepcopy(dict(body))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.secrets[key] = obj
        return copy.deepcopy(obj)

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        self._race()
        obj = self.secrets[(str(namespace), name)]
        want_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None and want_rv != obj["metadata"]["resourceVersion"]:
            raise ConflictError(name)
        self.rv += 1
        obj["data"] = dict(patch["data"])
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def patch_webhook_ca(self, name: str, ca_pem_b64: str) -> bool:
        assert name == "mwc"
        self.ca_bundle = ca_pem_b64
        return True

    def put(self, bundle: certs.Bundle) -> None:
        self.rv += 1
        self.secrets[("ns", "tls")] = {
            "metadata": {"name": "tls", "namespace": "ns", "resourceVersion": str(self.rv)},
            "data": bundle.secret_data(),
        }


def _serials(pem: bytes) -> list[int]:
    return [cert.serial_number for cert in x509.load_pem_x509_certificates(pem)]


def test_first_start_creates_the_secret_and_sets_the_ca_bundle() -> None:
    kube = FakeKube()
    bundle = serving_tls.obtain(kube, CFG)
    assert certs.needs_rotation(bundle, NAMES) is None
    stored = certs.Bundle.from_secret_data(kube.secrets[("ns", "tls")]["data"])
    assert stored == bundle
    assert base64.b64decode(kube.ca_bundle) == bundle.ca_crt
    rv = kube.secrets[("ns", "tls")]["metadata"]["resourceVersion"]
    assert serving_tls.obtain(kube, CFG) == bundle  # good: nothing written
    assert kube.secrets[("ns", "tls")]["metadata"]["resourceVersion"] == rv


def test_expiring_certificate_is_rotated_and_the_old_ca_stays_trusted() -> None:
    kube = FakeKube()
    old = certs.issue(NAMES, now=datetime.now(UTC) - timedelta(days=340))
    kube.put(old)
    new = serving_tls.obtain(kube, CFG)
    assert new.tls_crt != old.tls_crt
    assert certs.needs_rotation(new, NAMES) is None
    old_ca = _serials(old.ca_crt)[0]
    assert _serials(new.ca_crt)[1] == old_ca  # new CA first, previous one behind it
    assert _serials(base64.b64decode(kube.ca_bundle)) == _serials(new.ca_crt)
    # The next rotation keeps only one previous CA.
    later = datetime.now(UTC) + timedelta(days=340)
    again = serving_tls.obtain(kube, CFG, now=later)
    assert _serials(again.ca_crt)[1:] == _serials(new.ca_crt)[:1]


def test_new_names_force_a_rotation() -> None:
    kube = FakeKube()
    kube.put(certs.issue(NAMES[:1]))
    assert certs.needs_rotation(serving_tls.obtain(kube, CFG), NAMES) is None


def test_a_concurrent_rotation_by_another_replica_wins() -> None:
    kube = FakeKube()
    kube.put(certs.issue(NAMES, now=datetime.now(UTC) - timedelta(days=340)))
    theirs = certs.issue(NAMES)
    kube.before_write.append(lambda: kube.put(theirs))  # lands between our read and write
    got = serving_tls.obtain(kube, CFG)
    assert got == theirs
    assert base64.b64decode(kube.ca_bundle) == theirs.ca_crt


def test_concurrent_creation_uses_the_other_replicas_secret() -> None:
    kube = FakeKube()
    theirs = certs.issue(NAMES)
    kube.before_write.append(lambda: kube.put(theirs))
    assert serving_tls.obtain(kube, CFG) == theirs


def test_a_secret_that_never_settles_is_an_error() -> None:
    kube = FakeKube()
    kube.put(certs.issue(NAMES[:1]))

    def churn() -> None:
        kube.put(certs.issue(NAMES[:1]))  # always stale names: every attempt conflicts
        kube.before_write.append(churn)

    kube.before_write.append(churn)
    with pytest.raises(serving_tls.TlsError, match="kept changing"):
        serving_tls.obtain(kube, CFG)


def test_read_dir(tmp_path: Path) -> None:
    with pytest.raises(serving_tls.TlsError, match=str(tmp_path)):
        serving_tls.read_dir(tmp_path)
    b = certs.issue(NAMES)
    (tmp_path / "tls.crt").write_bytes(b.tls_crt)
    (tmp_path / "tls.key").write_bytes(b.tls_key)
    assert serving_tls.read_dir(tmp_path) == certs.Bundle(b"", b.tls_crt, b.tls_key)


def test_a_key_that_does_not_match_is_an_error() -> None:
    a, b = certs.issue(NAMES), certs.issue(NAMES)
    with pytest.raises(serving_tls.TlsError, match="do not load"):
        serving_tls.load_into(certs.Bundle(a.ca_crt, a.tls_crt, b.tls_key))


@pytest.fixture
def tls_server() -> Iterator[tuple[serving_tls.Keeper, list[certs.Bundle], int]]:
    """A TLS server on loopback whose context is the keeper's (one handshake per accept)."""
    served: list[certs.Bundle] = [certs.issue(NAMES)]
    keeper = serving_tls.Keeper(lambda: served[-1])
    keeper.refresh()
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            try:
                with keeper.context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield keeper, served, int(sock.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def _handshakes() -> float:
    return REGISTRY.get_sample_value("dynamiccl_webhook_tls_handshakes_total") or 0.0


def _peer_serial(port: int, ca: bytes) -> int:
    ctx = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        tls.sendall(b"x")
        return x509.load_der_x509_certificate(der).serial_number


def test_keeper_hot_reloads_the_served_certificate(
    tls_server: tuple[serving_tls.Keeper, list[certs.Bundle], int],
) -> None:
    keeper, served, port = tls_server
    first = served[0]
    seen: list[certs.Bundle] = []
    keeper.listeners.append(seen.append)
    first_serial = x509.load_pem_x509_certificate(first.tls_crt).serial_number
    before = _handshakes()
    assert _peer_serial(port, first.ca_crt) == first_serial
    assert _handshakes() == before + 1  # every new connection's handshake is counted
    assert keeper.refresh() is False  # unchanged: nothing reloaded, nobody told
    assert seen == []
    served.append(certs.issue(NAMES))
    assert keeper.refresh() is True
    assert seen == [served[-1]]
    new_serial = x509.load_pem_x509_certificate(served[-1].tls_crt).serial_number
    assert _peer_serial(port, served[-1].ca_crt) == new_serial  # same context, new handshake
    with pytest.raises(ssl.SSLError):  # the old CA no longer verifies what is served
        _peer_serial(port, first.ca_crt)


def test_keeper_tells_listeners_about_a_ca_only_change() -> None:
    b = certs.issue(NAMES)
    served = [b]
    keeper = serving_tls.Keeper(lambda: served[-1])
    keeper.refresh()
    seen: list[certs.Bundle] = []
    keeper.listeners.append(seen.append)
    served.append(certs.Bundle(b.ca_crt + certs.issue(NAMES).ca_crt, b.tls_crt, b.tls_key))
    assert keeper.refresh() is False
    assert seen == [served[-1]]
    assert keeper.reloads == 1


def test_keeper_run_survives_failing_checks(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    good = certs.issue(NAMES)

    def source() -> certs.Bundle:
        calls.append(1)
        if len(calls) in (2, 3):
            raise OSError("apiserver unreachable")
        return good if len(calls) < 4 else certs.issue(NAMES)

    keeper = serving_tls.Keeper(source)
    keeper.refresh()

    async def go() -> None:
        task = asyncio.create_task(keeper.run(0.01))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if keeper.reloads >= 2:
                break
        task.cancel()

    asyncio.run(go())
    assert keeper.reloads == 2  # recovered after two failed checks
    assert "apiserver unreachable" in caplog.text


def test_a_missing_namespace_is_a_clear_error() -> None:
    kube = FakeKube()

    def create(res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        raise NotFoundError("namespaces/ns")

    kube.create = create  # type: ignore[method-assign]
    with pytest.raises(serving_tls.TlsError, match="namespace 'ns' not found"):
        serving_tls.obtain(kube, CFG)

"""The webhook's serving certificate at run time: obtain, rotate, hot-reload.

Two sources:

- cert-manager (``--tls-dir``): ``tls.crt``/``tls.key`` of a mounted Secret that
  the kubelet refreshes after cert-manager renews it; re-read on every check
  (cert-manager's CA injector keeps the caBundle current).
- self-managed: the Secret ``--tls-secret`` in the operator's namespace. When
  ``certs.needs_rotation`` says so, a new CA + serving certificate are written
  with optimistic concurrency (the patch carries the Secret's
  ``resourceVersion``; when another replica rotated first, its certificate is
  used). The previous CA stays in ``ca.crt`` behind the new one, so the
  caBundle trusts both while the other replica still serves the old
  certificate. Every check also puts the caBundle back into our
  MutatingWebhookConfiguration if it drifted (e.g. after a ``helm upgrade``).

``Keeper`` runs the check every ``interval`` seconds and, when the bundle
changed, builds a new ``ssl.SSLContext`` for it; the listening context's SNI
callback (called on every handshake) hands new connections the newest one, and
open connections finish on the old one: no restart, no dropped requests, no
context modified while another thread may use it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from dynamiccl import constants as c
from dynamiccl.operator import metrics
from dynamiccl.operator.kube import SECRETS, ConflictError, NotFoundError, Patcher, Resource
from dynamiccl.operator.webhook import certs

log = logging.getLogger("dynamiccl.operator.tls")
WRITE_ATTEMPTS = 3


class TlsError(RuntimeError):
    """No usable serving certificate; the message says why."""


class SecretApi(Patcher, Protocol):
    """What the self-managed source needs from ``kube.Kube``."""

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def patch_webhook_ca(self, name: str, ca_pem_b64: str) -> bool: ...


@dataclass(frozen=True)
class SelfManaged:
    """Where the self-managed certificate lives and what it must cover."""

    namespace: str
    secret: str
    webhook_config: str
    names: tuple[str, ...]


def read_dir(path: Path) -> certs.Bundle:
    """The bundle in a cert-manager Secret mount (``ca.crt`` optional)."""
    try:
        ca = path / "ca.crt"
        return certs.Bundle(
            ca_crt=ca.read_bytes() if ca.exists() else b"",
            tls_crt=(path / "tls.crt").read_bytes(),
            tls_key=(path / "tls.key").read_bytes(),
        )
    except OSError as exc:
        raise TlsError(f"--tls-dir {path}: {exc.strerror}") from exc


def with_previous_ca(new: certs.Bundle, old: certs.Bundle | None, now: datetime) -> certs.Bundle:
    """``new`` whose ``ca.crt`` also trusts the old CA (if still valid), new CA first."""
    if old is None:
        return new
    try:
        prev = x509.load_pem_x509_certificate(old.ca_crt)
    except ValueError:
        return new
    if prev.not_valid_after_utc <= now:
        return new
    pem = prev.public_bytes(serialization.Encoding.PEM)
    return certs.Bundle(new.ca_crt + pem, new.tls_crt, new.tls_key, new.ca_key)


def obtain(api: SecretApi, cfg: SelfManaged, now: datetime | None = None) -> certs.Bundle:
    """Blocking: the Secret's bundle, rotated first if needed; caBundle kept current."""
    for _ in range(WRITE_ATTEMPTS):
        at = now or datetime.now(UTC)
        try:
            secret: dict[str, Any] | None = api.get(SECRETS, cfg.secret, cfg.namespace)
        except NotFoundError:
            secret = None
        current = certs.Bundle.from_secret_data((secret or {}).get("data") or {})
        why = certs.needs_rotation(current, cfg.names, at)
        if why is None and current is not None:
            break
        log.info("issuing webhook certificate: %s", why)
        bundle = with_previous_ca(certs.issue(cfg.names, at), current, at)
        try:
            if secret is None:
                api.create(SECRETS, _secret_body(cfg, bundle))
            else:
                rv = (secret.get("metadata") or {}).get("resourceVersion")
                patch = {"metadata": {"resourceVersion": rv}, "data": bundle.secret_data()}
                api.patch(SECRETS, cfg.secret, patch, cfg.namespace)
        except ConflictError:
            log.info("webhook certificate changed concurrently (another replica); re-reading")
            continue
        except NotFoundError:
            if secret is None:  # creating in a namespace that does not exist
                raise TlsError(
                    f"cannot create secret {cfg.namespace}/{cfg.secret}: "
                    f"namespace {cfg.namespace!r} not found (--namespace)"
                ) from None
            continue  # deleted under us: create it on the next attempt
        metrics.CERT_ROTATIONS.inc()
        current = bundle
        break
    else:
        raise TlsError(f"secret {cfg.namespace}/{cfg.secret}: kept changing while rotating")
    if api.patch_webhook_ca(cfg.webhook_config, certs.ca_bundle_b64(current)):
        log.debug("caBundle of MutatingWebhookConfiguration %s is current", cfg.webhook_config)
    return current


def _secret_body(cfg: SelfManaged, bundle: certs.Bundle) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": cfg.secret,
            "namespace": cfg.namespace,
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY},
        },
        "data": bundle.secret_data(),
    }


def load_into(bundle: certs.Bundle, ctx: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """Load a serving certificate into a (new or existing) server context."""
    ctx = ctx or ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as tmp:
        crt, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        crt.write_bytes(bundle.tls_crt)
        key.write_bytes(bundle.tls_key)
        try:
            ctx.load_cert_chain(crt, key)
        except ssl.SSLError as exc:
            raise TlsError(f"serving certificate and key do not load: {exc.reason}") from exc
    return ctx


@dataclass
class Keeper:
    """Serves the current bundle and switches to a new one without touching live contexts.

    ``context`` is the listening socket's context. Its SNI callback, which OpenSSL
    calls on every ClientHello (with or without SNI), counts the handshake and
    hands the connection the context of the newest bundle. A rotation builds a
    fresh ``SSLContext`` and swaps one reference: no context that another
    thread may be using is ever modified.
    """

    source: Callable[[], certs.Bundle]  # blocking; raises on failure
    current: certs.Bundle | None = None
    listeners: list[Callable[[certs.Bundle], None]] = field(default_factory=list)
    reloads: int = 0
    context: ssl.SSLContext = field(init=False)
    _serving: ssl.SSLContext | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.sni_callback = self._hello

    def _hello(self, conn: Any, _server_name: str | None, ctx: ssl.SSLContext) -> None:
        metrics.WEBHOOK_HANDSHAKES.inc()
        serving = self._serving
        if serving is not None and serving is not ctx:
            conn.context = serving

    def refresh(self) -> bool:
        """Blocking: fetch the bundle; True if a new one is now served."""
        bundle = self.source()
        cur = self.current
        if cur is not None and (bundle.tls_crt, bundle.tls_key) == (cur.tls_crt, cur.tls_key):
            if bundle.ca_crt != cur.ca_crt:
                self.current = bundle
                self._notify(bundle)
            return False
        fresh = load_into(bundle)
        if cur is None:  # before serving starts: also the listening context's own certificate
            load_into(bundle, self.context)
        self._serving = fresh
        self.current = bundle
        self.reloads += 1
        self._notify(bundle)
        if cur is not None:
            log.info("webhook serving certificate reloaded")
        return True

    def _notify(self, bundle: certs.Bundle) -> None:
        for listener in self.listeners:
            listener(bundle)

    async def run(self, interval: float) -> None:
        """Check every ``interval`` seconds until cancelled; failures are logged, never raised."""
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.refresh)
            except Exception as exc:
                log.warning("webhook certificate check failed (serving the current one): %s", exc)

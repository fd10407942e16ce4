"""The ingest's serving certificate, reloaded when its files change (like the webhook's).

cert-manager (or the operator's own rotation) renews the certificate in the
Secret the ingest mounts; the kubelet then replaces `tls.crt`/`tls.key` in the
pod. `ReloadingTLS.check()` reads both files and, when they differ from what is
served, builds a fresh `SSLContext` for them. The listening context's SNI
callback, which OpenSSL calls on every ClientHello, hands each new connection the
newest context; open connections finish on the old one. No context another
thread may use is ever modified, nothing restarts, no request is dropped. A pair
that does not load (the kubelet between two file writes) is logged and retried
at the next check, the current certificate still served.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("dynamiccl.operator.ingest.tls")
CHECK_INTERVAL_S = 30.0


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """TLS ≥ 1.2 server context from a PEM certificate (chain) and key."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx


@dataclass
class ReloadingTLS:
    """The listening context (`context`) and the newest certificate's context behind it."""

    cert_file: Path
    key_file: Path
    reloads: int = 0
    context: ssl.SSLContext = field(init=False)
    _pair: tuple[bytes, bytes] = field(init=False, repr=False)
    _serving: ssl.SSLContext = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._pair = self._read()
        self.context = server_context(self.cert_file, self.key_file)
        self._serving = self.context
        self.context.sni_callback = self._hello

    def _read(self) -> tuple[bytes, bytes]:
        return self.cert_file.read_bytes(), self.key_file.read_bytes()

    def _hello(self, conn: Any, _server_name: str | None, ctx: ssl.SSLContext) -> None:
        serving = self._serving
        if serving is not ctx:
            conn.context = serving

    def check(self) -> bool:
        """Blocking: True when a changed certificate is now served (raises if unreadable)."""
        pair = self._read()
        if pair == self._pair:
            return False
        fresh = server_context(self.cert_file, self.key_file)
        self._serving, self._pair = fresh, pair
        self.reloads += 1
        log.info("ingest serving certificate reloaded (%s)", self.cert_file)
        return True

    async def run(self, interval: float = CHECK_INTERVAL_S) -> None:
        """Check every `interval` seconds until cancelled; failures are logged, never raised."""
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.check)
            except (OSError, ssl.SSLError) as exc:
                log.warning("ingest certificate check failed (serving the current one): %s", exc)

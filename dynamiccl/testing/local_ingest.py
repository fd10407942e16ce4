"""The operator's reward-ingest endpoint and experience store, run locally (the demo, GPU tools).

The real pieces: `operator/store/experience.py` on an embedded SQLite file (WAL,
synchronous=FULL), `operator/ingest/writer.py` (group commit),
`operator/ingest/app.py` (the aiohttp handler: auth, size limits, validation,
idempotency) served over HTTPS with a certificate from `operator/webhook/certs.py`.
Only the API-server lookups behind the ingest's two Protocols are local stand-ins
(`dynamiccl.testing.auth`). The server runs in a background thread with its own event loop,
as the operator's ingest process would run beside the jobs.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from dynamiccl import constants as c
from dynamiccl.operator.ingest.app import (
    IngestHandler,
    IngestMetrics,
    build_app,
    server_ssl_context,
    start_server,
)
from dynamiccl.operator.ingest.writer import BatchWriter
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.webhook.certs import issue
from dynamiccl.testing.auth import LocalPodJobResolver, LocalTokenReviewer, TokenIssuer


class IngestService:
    """Store + HTTPS ingest on 127.0.0.1 (a free port); `close()` stops both."""

    def __init__(self, workdir: Path, store_path: Path, issuer: TokenIssuer) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        bundle = issue(["127.0.0.1", "localhost"])
        (workdir / "tls.crt").write_bytes(bundle.tls_crt)
        (workdir / "tls.key").write_bytes(bundle.tls_key)
        (workdir / "tls.key").chmod(0o600)
        self.ca_pem = bundle.ca_crt.decode()
        self.store_url = f"sqlite:///{store_path}"
        self.store: ExperienceStore = open_store(self.store_url)
        self.resolver = LocalPodJobResolver()
        self.reviewer = LocalTokenReviewer(issuer)
        self.metrics = IngestMetrics()
        self._ssl = server_ssl_context(workdir / "tls.crt", workdir / "tls.key")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None
        self._writer: BatchWriter | None = None
        self.port = self._call(self._start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _start(self) -> int:
        self._writer = BatchWriter(self.store)
        handler = IngestHandler(
            reviewer=self.reviewer,
            resolver=self.resolver,
            writer=self._writer,
            metrics=self.metrics,
        )
        self._runner, port = await start_server(
            build_app(handler), host="127.0.0.1", port=0, ssl_context=self._ssl
        )
        return port

    @property
    def url(self) -> str:
        """The ingest URL a sidecar posts to."""
        return f"https://127.0.0.1:{self.port}{c.INGEST_PATH}"

    def counter(self, name: str, **labels: str) -> float:
        """A value of the ingest's metrics registry (0 if never incremented)."""
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return float(value or 0.0)

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._writer is not None:
            await self._writer.close()

    def close(self) -> None:
        """Stop serving (after finishing pending writes), stop the thread, close the store."""
        try:
            self._call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            self.store.close()

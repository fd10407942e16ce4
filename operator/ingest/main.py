"""Run the reward-ingest endpoint: as part of the operator, or as its own process.

`IngestService` wires the pieces (store + group-commit writer + Kubernetes auth
+ caches + aiohttp app + TLS) and is what `dynamiccl operator` starts next to
kopf. As a process (tests, benchmarks, debugging):

    python -m dynamiccl.operator.ingest.main --store sqlite:////data/experience.db \\
        --tls-cert tls.crt --tls-key tls.key [--kubeconfig ~/.kube/config] [--port 8443]

prints one JSON line `{"port": ..., "store": ...}` once it listens, and stops
cleanly on SIGTERM/SIGINT (pending commits finish first). With
`--loop-namespace` it also runs the learning loop (operator/learning/loop.py)
every `--loop-interval` seconds: it needs the store's volume, which this
process has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time

from aiohttp import web

from dynamiccl.api.store_secrets import redact_message
from dynamiccl.operator.ingest.app import (
    IngestConfig,
    IngestHandler,
    IngestMetrics,
    build_app,
    start_server,
)
from dynamiccl.operator.ingest.auth import (
    CachingPodJobResolver,
    CachingTokenReviewer,
    CachingTunedJobs,
    PodJobResolver,
    TokenReviewer,
    TunedJobs,
)
from dynamiccl.operator.ingest.cli import parse
from dynamiccl.operator.ingest.model_serve import ModelServer
from dynamiccl.operator.ingest.ratelimit import UNLIMITED, RateLimiter
from dynamiccl.operator.ingest.settings import IngestSettings
from dynamiccl.operator.ingest.tls import ReloadingTLS
from dynamiccl.operator.ingest.writer import BatchWriter
from dynamiccl.operator.learning.leader import LeaderElector
from dynamiccl.operator.learning.loop import LearningLoop
from dynamiccl.operator.learning.metrics import LoopMetrics
from dynamiccl.operator.store.backend import StoreURLError
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.operator.store.rollup import rollup

log = logging.getLogger("dynamiccl.operator.ingest.app")


def limiter(settings: IngestSettings) -> RateLimiter | None:
    """The rate limiter the settings ask for (None when both limits are off)."""
    s = settings
    if s.rate_pod is None and s.rate_job is None and s.rate_store is None:
        return None
    return RateLimiter(s.rate_pod or UNLIMITED, s.rate_job or UNLIMITED, total=s.rate_store)


class IngestService:
    """The running endpoint; `await start()`, then `await stop()`."""

    def __init__(
        self,
        settings: IngestSettings,
        *,
        reviewer: TokenReviewer | None = None,
        resolver: PodJobResolver | None = None,
        store: ExperienceStore | None = None,
        tuned: TunedJobs | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = IngestMetrics()
        self.loop_metrics = LoopMetrics(self.metrics.registry)  # zero when no loop runs here
        self.store = store or open_store(settings.store_url)
        if reviewer is None or resolver is None:
            from dynamiccl.kubeclient import api_client  # noqa: PLC0415
            from dynamiccl.operator.ingest.kube import KubeIngestAuth  # noqa: PLC0415

            kube = KubeIngestAuth(api_client(settings.kubeconfig))
            reviewer, resolver = reviewer or kube, resolver or kube
            tuned = tuned or kube  # with the API server, the model-version check is always made
        self.reviewer = CachingTokenReviewer(reviewer)
        self.resolver = CachingPodJobResolver(resolver)
        self.tuned = CachingTunedJobs(tuned) if tuned is not None else None
        self.writer = BatchWriter(
            self.store, max_group=settings.max_group, on_commit=self.metrics.group.observe
        )
        self.handler = IngestHandler(
            reviewer=self.reviewer,
            resolver=self.resolver,
            writer=self.writer,
            metrics=self.metrics,
            config=IngestConfig(audience=settings.audience),
            tuned=self.tuned,
            limiter=limiter(settings),
        )
        self.registry = ModelRegistry(self.store.backend)
        self.models = ModelServer(
            reviewer=self.reviewer,
            lookup=self.registry.get,
            readers=frozenset(settings.model_readers),
            audience=settings.audience,
        )
        self._runner: web.AppRunner | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._retention_task: asyncio.Task[None] | None = None
        self._tls_task: asyncio.Task[None] | None = None
        self.tls: ReloadingTLS | None = None
        self.learning: LearningLoop | None = None
        self.elector: LeaderElector | None = None
        self._elector_task: asyncio.Task[None] | None = None
        if settings.loop is not None:
            from dynamiccl.operator.kube import Kube  # noqa: PLC0415 - only with the loop

            kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None
            cluster = Kube(kubeconfig)
            self.learning = LearningLoop(self.store, self.registry, cluster, settings.loop)
            if settings.loop_lease:
                self.elector = LeaderElector(
                    cluster, settings.loop.namespace, settings.loop_lease, settings.loop_identity
                )
        self.port = 0

    async def start(self) -> int:
        s = self.settings
        ctx = None
        if s.tls_cert is not None and s.tls_key is not None:
            self.tls = ReloadingTLS(s.tls_cert, s.tls_key)
            ctx = self.tls.context
            self._tls_task = asyncio.get_running_loop().create_task(
                self.tls.run(s.tls_reload_interval_s)
            )
        self._runner, self.port = await start_server(
            build_app(self.handler, self.models), host=s.host, port=s.port, ssl_context=ctx
        )
        if self.elector is not None:
            self._elector_task = asyncio.get_running_loop().create_task(self._run_elector())
        if self.learning is not None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run_loop())
        if any(
            v is not None for v in (s.retention_max_age_s, s.retention_max_rows, s.rollup_after_s)
        ):
            self._retention_task = asyncio.get_running_loop().create_task(self._run_retention())
        return self.port

    def apply_retention(self) -> None:
        """One retention pass with the configured limits (logged): the roll-up first."""
        s = self.settings
        if s.rollup_after_s is not None:
            rolled = rollup(
                self.store.backend,
                before_unix_s=time.time() - s.rollup_after_s,
                max_id=self.registry.last_experience_cursor(),
            )
            log.info("roll-up: %d experience rows into %d", rolled.rows_before, rolled.rows_after)
        res = self.store.apply_retention(
            max_age_s=s.retention_max_age_s, max_rows=s.retention_max_rows
        )
        log.info(
            "retention: deleted %d experience rows, %d events, %d idempotency keys",
            res.experience,
            res.events,
            res.batches,
        )

    def leads(self) -> bool:
        """Whether this replica runs the loop and the retention pass now (always, when no
        Lease elects one: a single replica)."""
        return self.elector is None or self.elector.held

    async def _run_elector(self) -> None:
        assert self.elector is not None
        while True:
            try:
                await asyncio.to_thread(self.elector.step)
            except Exception as exc:  # the API server: keep trying; `held` runs out alone
                log.warning("learning loop lease: %s", exc)
            self.metrics.leader.set(1 if self.elector.held else 0)
            await asyncio.sleep(self.elector.retry_s)

    async def _run_retention(self) -> None:
        while True:
            try:
                if self.leads():
                    await asyncio.to_thread(self.apply_retention)
            except Exception as exc:
                log.warning("retention failed: %s", exc)
            await asyncio.sleep(self.settings.retention_interval_s)

    async def _run_loop(self) -> None:
        assert self.learning is not None
        while True:
            if not self.leads():
                await asyncio.sleep(self.elector.retry_s if self.elector else 1.0)
                continue
            t0 = time.perf_counter()
            rep = await asyncio.to_thread(self.learning.tick)
            self.loop_metrics.observe(rep, time.perf_counter() - t0)
            for err in rep.errors:
                log.warning("learning loop: %s", err)
            if rep.launched_job or rep.registered or (rep.rollout and rep.rollout.action != "none"):
                log.info("learning loop: %s", rep)
            await asyncio.sleep(self.settings.loop_interval_s)

    async def stop(self) -> None:
        for task in (self._loop_task, self._retention_task, self._tls_task, self._elector_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.elector is not None:
            with contextlib.suppress(Exception):  # best effort: the Lease also just expires
                await asyncio.to_thread(self.elector.release)
        if self._runner is not None:
            await self._runner.cleanup()
        await self.writer.close()
        self.store.close()


async def _serve(settings: IngestSettings) -> None:
    svc = IngestService(settings)
    port = await svc.start()
    print(json.dumps({"port": port, "store": svc.store.backend.display_url}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await svc.stop()


def psycopg_errors() -> type[Exception]:
    """psycopg's base error when it is installed (a PostgreSQL store), else a stand-in."""
    try:
        import psycopg  # noqa: PLC0415 - optional backend
    except ImportError:
        return OSError
    return psycopg.Error


def main(argv: list[str] | None = None) -> int:
    settings = parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(_serve(settings))
    except (StoreURLError, FileNotFoundError, OSError, psycopg_errors()) as exc:
        print(f"ingest: {redact_message(str(exc), settings.store_url)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

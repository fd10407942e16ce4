"""Run the reward-ingest endpoint: as part of the operator, or as its own process.

`IngestService` wires the pieces (store + group-commit writer + Kubernetes auth
+ caches + aiohttp app + TLS) and is what `dynamiccl operator` starts next to
kopf. As a process (tests, benchmarks, debugging):

    python -m dynamiccl.operator.ingest_main --store sqlite:////data/experience.db \\
        --tls-cert tls.crt --tls-key tls.key [--kubeconfig ~/.kube/config] [--port 8443]

prints one JSON line `{"port": ..., "store": ...}` once it listens, and stops
cleanly on SIGTERM/SIGINT (pending commits finish first). With
`--loop-namespace` it also runs the learning loop (operator/learning_loop.py)
every `--loop-interval` seconds: it needs the store's volume, which this
process has.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from dynamiccl import constants as c
from dynamiccl.operator.ingest import (
    IngestConfig,
    IngestHandler,
    IngestMetrics,
    build_app,
    server_ssl_context,
    start_server,
)
from dynamiccl.operator.ingest_auth import (
    SA_USER_PREFIX,
    CachingPodJobResolver,
    CachingTokenReviewer,
    PodJobResolver,
    TokenReviewer,
)
from dynamiccl.operator.ingest_writer import DEFAULT_MAX_GROUP, BatchWriter
from dynamiccl.operator.learning_loop import LearningLoop, LoopConfig
from dynamiccl.operator.loop_metrics import LoopMetrics
from dynamiccl.operator.model_registry import ModelRegistry
from dynamiccl.operator.model_serve import ModelServer
from dynamiccl.operator.store import ExperienceStore, open_store
from dynamiccl.operator.store_backend import StoreURLError

log = logging.getLogger("dynamiccl.operator.ingest")
ENV_MODEL_READERS = "DYNAMICCL_MODEL_READERS"


@dataclass(frozen=True)
class IngestSettings:
    """Where to listen, what to store into, how to authenticate."""

    store_url: str
    tls_cert: Path | None
    tls_key: Path | None
    host: str = "0.0.0.0"
    port: int = 8443
    kubeconfig: Path | None = None  # None: in-cluster credentials
    audience: str = c.INGEST_AUDIENCE
    max_group: int = DEFAULT_MAX_GROUP
    loop: LoopConfig | None = None  # run the learning loop here (it needs the store's volume)
    loop_interval_s: float = 30.0
    retention_max_age_s: float | None = None  # delete experience older than this
    retention_max_rows: int | None = None  # keep at most this many experience rows
    retention_interval_s: float = 3600.0
    # who may GET /v1/models/<v>.npz: usernames (the operator's ServiceAccount)
    model_readers: tuple[str, ...] = ()


class IngestService:
    """The running endpoint; `await start()`, then `await stop()`."""

    def __init__(
        self,
        settings: IngestSettings,
        *,
        reviewer: TokenReviewer | None = None,
        resolver: PodJobResolver | None = None,
        store: ExperienceStore | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = IngestMetrics()
        self.loop_metrics = LoopMetrics(self.metrics.registry)  # zero when no loop runs here
        self.store = store or open_store(settings.store_url)
        if reviewer is None or resolver is None:
            from dynamiccl.operator.ingest_kube import KubeIngestAuth, api_client  # noqa: PLC0415

            kube = KubeIngestAuth(api_client(settings.kubeconfig))
            reviewer, resolver = reviewer or kube, resolver or kube
        self.reviewer = CachingTokenReviewer(reviewer)
        self.resolver = CachingPodJobResolver(resolver)
        self.writer = BatchWriter(
            self.store, max_group=settings.max_group, on_commit=self.metrics.group.observe
        )
        self.handler = IngestHandler(
            reviewer=self.reviewer,
            resolver=self.resolver,
            writer=self.writer,
            metrics=self.metrics,
            config=IngestConfig(audience=settings.audience),
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
        self.learning: LearningLoop | None = None
        if settings.loop is not None:
            from dynamiccl.operator.kube import Kube  # noqa: PLC0415 - only with the loop

            kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None
            self.learning = LearningLoop(self.store, self.registry, Kube(kubeconfig), settings.loop)
        self.port = 0

    async def start(self) -> int:
        s = self.settings
        tls = None
        if s.tls_cert is not None and s.tls_key is not None:
            tls = server_ssl_context(s.tls_cert, s.tls_key)
        self._runner, self.port = await start_server(
            build_app(self.handler, self.models), host=s.host, port=s.port, ssl_context=tls
        )
        if self.learning is not None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run_loop())
        if s.retention_max_age_s is not None or s.retention_max_rows is not None:
            self._retention_task = asyncio.get_running_loop().create_task(self._run_retention())
        return self.port

    def apply_retention(self) -> None:
        """One retention pass with the configured limits (logged)."""
        s = self.settings
        res = self.store.apply_retention(
            max_age_s=s.retention_max_age_s, max_rows=s.retention_max_rows
        )
        log.info(
            "retention: deleted %d experience rows, %d events, %d idempotency keys",
            res.experience,
            res.events,
            res.batches,
        )

    async def _run_retention(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.apply_retention)
            except Exception as exc:
                log.warning("retention failed: %s", exc)
            await asyncio.sleep(self.settings.retention_interval_s)

    async def _run_loop(self) -> None:
        assert self.learning is not None
        while True:
            t0 = time.perf_counter()
            rep = await asyncio.to_thread(self.learning.tick)
            self.loop_metrics.observe(rep, time.perf_counter() - t0)
            for err in rep.errors:
                log.warning("learning loop: %s", err)
            if rep.launched_job or rep.registered or (rep.rollout and rep.rollout.action != "none"):
                log.info("learning loop: %s", rep)
            await asyncio.sleep(self.settings.loop_interval_s)

    async def stop(self) -> None:
        for task in (self._loop_task, self._retention_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._runner is not None:
            await self._runner.cleanup()
        await self.writer.close()
        self.store.close()


def _parse(argv: list[str] | None) -> IngestSettings:
    p = argparse.ArgumentParser(prog="python -m dynamiccl.operator.ingest_main")
    p.add_argument("--store", required=True, help="store URL (path, sqlite:///, postgresql://)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--tls-cert", type=Path)
    p.add_argument("--tls-key", type=Path)
    p.add_argument("--insecure-http", action="store_true", help="no TLS (local debugging only)")
    p.add_argument("--kubeconfig", type=Path, help="default: in-cluster credentials")
    p.add_argument("--audience", default=c.INGEST_AUDIENCE)
    p.add_argument("--max-group", type=int, default=DEFAULT_MAX_GROUP)
    p.add_argument(
        "--model-reader",
        action="append",
        default=[],
        metavar="USER",
        help="may GET /v1/models/<version>.npz (system:serviceaccount:<ns>:<operator-sa>); "
        "repeatable; env DYNAMICCL_MODEL_READERS (comma-separated) adds more",
    )
    r = p.add_argument_group("retention (hourly)")
    r.add_argument("--retention-days", type=float, help="delete experience older than this")
    r.add_argument("--retention-max-rows", type=int, help="keep at most this many rows")
    g = p.add_argument_group("learning loop (status sync, retraining, model rollout)")
    g.add_argument("--loop-namespace", help="run the loop; retraining Jobs go to this namespace")
    g.add_argument("--loop-image", default="", help="image of the retraining Job")
    g.add_argument("--loop-pvc", default="", help="PVC holding the store and the models")
    g.add_argument("--loop-mount-path", default="/var/lib/dynamiccl")
    g.add_argument("--loop-store-url", default="", help="store URL as the Job sees it")
    g.add_argument(
        "--loop-store-secret",
        default="",
        help="Secret (key url) the Job reads the store URL from; its spec then carries none",
    )
    g.add_argument("--loop-service-account", default="dynamiccl-train")
    g.add_argument(
        "--loop-colocate-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="labels of this pod: the Job runs on its node (SQLite on a RWO volume)",
    )
    g.add_argument("--loop-interval", type=float, default=30.0)
    a = p.parse_args(argv)
    if not a.insecure_http and (a.tls_cert is None or a.tls_key is None):
        p.error("--tls-cert and --tls-key are required (or --insecure-http)")
    if a.retention_days is not None and a.retention_days <= 0:
        p.error("--retention-days must be > 0")
    if a.retention_max_rows is not None and a.retention_max_rows < 0:
        p.error("--retention-max-rows must be >= 0")
    loop = None
    if a.loop_namespace:
        if not a.loop_image or not a.loop_pvc:
            p.error("--loop-namespace needs --loop-image and --loop-pvc")
        bad = [kv for kv in a.loop_colocate_label if "=" not in kv]
        if bad:
            p.error(f"--loop-colocate-label: expected KEY=VALUE, got {bad[0]!r}")
        loop = LoopConfig(
            namespace=a.loop_namespace,
            image=a.loop_image,
            store_url=a.loop_store_url or a.store,
            pvc_name=a.loop_pvc,
            store_url_secret=a.loop_store_secret or None,
            mount_path=a.loop_mount_path,
            service_account=a.loop_service_account,
            colocate_with=dict(kv.split("=", 1) for kv in a.loop_colocate_label) or None,
        )
    readers = [*a.model_reader, *os.environ.get(ENV_MODEL_READERS, "").split(",")]
    bad = [r for r in readers if r.strip() and not r.strip().startswith(SA_USER_PREFIX)]
    if bad:
        p.error(f"--model-reader: expected {SA_USER_PREFIX}<ns>:<name>, got {bad[0]!r}")
    return IngestSettings(
        store_url=a.store,
        tls_cert=a.tls_cert,
        tls_key=a.tls_key,
        host=a.host,
        port=a.port,
        kubeconfig=a.kubeconfig,
        audience=a.audience,
        max_group=a.max_group,
        loop=loop,
        loop_interval_s=a.loop_interval,
        retention_max_age_s=a.retention_days * 86_400.0 if a.retention_days else None,
        retention_max_rows=a.retention_max_rows,
        model_readers=tuple(sorted({r.strip() for r in readers if r.strip()})),
    )


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


def main(argv: list[str] | None = None) -> int:
    settings = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(_serve(settings))
    except (StoreURLError, FileNotFoundError, OSError) as exc:
        print(f"ingest: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

"""Start-up of ``dynamiccl operator``: caches, TLS, webhook, metrics, kopf — one event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fnmatch
import json
import logging
import os
import random
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamiccl import constants as c
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import configmap, jobkinds, model_fetch, policy_status
from dynamiccl.operator.controller.cache import (
    ObjectCache,
    shrink_config_map,
    shrink_node,
    shrink_node_topology,
)
from dynamiccl.operator.kube import CONFIGMAPS, NAMESPACES, NODES, Kube, NotFoundError, Resource
from dynamiccl.operator.webhook import certs, serving_tls
from dynamiccl.operator.webhook import server as webhook

log = logging.getLogger("dynamiccl.operator")
CM_SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY},{c.LABEL_COMPONENT}=job-config"
# A pod created before its job's ConfigMap waits this long for it: well inside the
# webhook's answer budget (operator/webhook/server.py ANSWER_BUDGET_S, 2.5 s), which is
# itself inside the timeoutSeconds (<= 3 s) the apiserver gives the webhook.
MISS_WAIT_SECONDS = 1.5
# Blocking work (webhook cache misses, reconciles, certificate checks) runs in threads;
# asyncio's default pool (cores + 4) would queue webhook misses behind slow reconciles.
THREADS = 32
# The webhook thread and kopf's loop share the GIL; CPython's default hand-over
# interval (5 ms) let a busy kopf loop hold it across many of the webhook's small
# steps (benchmarks/webhook_bench.py --handlers: TLS connections piled up, p50 1.7 s).
SWITCH_INTERVAL = 0.0005


class StartupError(RuntimeError):
    """The operator cannot start; the message says why."""


@dataclass(frozen=True)
class Settings:
    """Command-line settings (see ``dynamiccl operator --help``)."""

    kubeconfig: str | None
    namespace: str
    webhook_host: str
    webhook_port: int
    metrics_port: int
    tls_dir: Path | None
    tls_secret: str
    webhook_config: str
    service: str
    extra_sans: tuple[str, ...]
    image: str
    ingest_url: str
    peering: str | None
    handlers: bool
    log_json: bool
    watch_namespaces: tuple[str, ...] = ()  # kopf namespace names/globs; () = cluster-wide
    cert_check_interval: float = 600.0  # seconds between certificate checks (rotation, reload)
    # the operator's token for GET <ingest>/v1/models/<v>.npz (retrained models' tables)
    model_token_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def _logging(as_json: bool) -> None:
    handler = logging.StreamHandler()
    if as_json:
        handler.setFormatter(_JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # kopf logs every handled event of every object at INFO ("Handler ... succeeded"):
    # one line per training pod event. Our reconciles log what matters; kopf's
    # warnings and errors still show.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def tls_source(kube: Kube, s: Settings) -> Callable[[], certs.Bundle]:
    """Where the serving certificate comes from: --tls-dir (cert-manager) or our Secret."""
    if s.tls_dir is not None:
        tls_dir = s.tls_dir
        return lambda: serving_tls.read_dir(tls_dir)
    cfg = serving_tls.SelfManaged(
        namespace=s.namespace,
        secret=s.tls_secret,
        webhook_config=s.webhook_config,
        names=(*certs.service_names(s.service, s.namespace), *s.extra_sans),
    )
    return lambda: serving_tls.obtain(kube, cfg)


def miss_lookup(kube: Kube, cms: ObjectCache) -> webhook.MissLookup:
    """On a cache miss: GET the ConfigMap; if the job opted in, wait briefly for it."""

    def lookup(ns: str, job: str, pod: Any) -> Any:
        name = configmap.object_name(job)
        try:
            return kube.get(CONFIGMAPS, name, ns)
        except NotFoundError:
            pass
        from dynamiccl.operator.controller.handlers import Reconciler  # noqa: PLC0415

        owner = Reconciler.job_of_pod(_KubeOnly(kube), pod)  # type: ignore[arg-type]
        if owner is None:
            return None
        ann = (owner.get("metadata") or {}).get("annotations") or {}
        parsed = job_annotations.parse(ann)
        if parsed.tune is None:
            try:
                ns_obj = kube.get(NAMESPACES, ns)
            except NotFoundError:
                return None
            if not job_annotations.opted_in(
                parsed, (ns_obj.get("metadata") or {}).get("labels") or {}
            ):
                return None
        elif not parsed.tune or parsed.errors:
            return None
        return cms.wait_for(ns, name, MISS_WAIT_SECONDS)

    return lookup


@dataclass
class _KubeOnly:
    kube: Kube


async def _amain(s: Settings) -> None:
    sys.setswitchinterval(SWITCH_INTERVAL)
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="dynamiccl")
    )
    if s.kubeconfig:
        os.environ[c.ENV_KUBECONFIG] = s.kubeconfig
    try:
        kube = Kube(s.kubeconfig)
    except Exception as exc:
        raise StartupError(f"cannot load Kubernetes credentials: {exc}") from exc
    stop = threading.Event()
    cms = ObjectCache(shrink_config_map)
    cms.start(kube, CONFIGMAPS, stop, CM_SELECTOR)
    keeper = serving_tls.Keeper(tls_source(kube, s))
    try:
        await asyncio.to_thread(keeper.refresh)
    except (serving_tls.TlsError, OSError) as exc:
        raise StartupError(str(exc)) from exc
    cert_checks = asyncio.create_task(keeper.run(s.cert_check_interval))
    admission = webhook.Admission(cms, s.image, s.ingest_url, miss_lookup(kube, cms))
    server = webhook.ServerThread(
        webhook.app(admission, ready=cms.synced.is_set),
        s.webhook_host,
        s.webhook_port,
        keeper.context,
        THREADS,
    )
    try:
        await asyncio.to_thread(server.start)
    except OSError as exc:
        cert_checks.cancel()
        raise StartupError(
            f"--webhook-host/--webhook-port {s.webhook_host}:{s.webhook_port}: {exc.strerror}"
        ) from exc
    if s.metrics_port:
        from prometheus_client import start_http_server  # noqa: PLC0415

        start_http_server(s.metrics_port)
    log.info("webhook listening on https://%s:%d/mutate", s.webhook_host, s.webhook_port)
    try:
        if s.handlers:
            await _run_kopf(kube, s, cms, stop, keeper)
        else:
            await asyncio.Event().wait()
    finally:
        stop.set()
        cert_checks.cancel()
        await asyncio.to_thread(server.stop)


async def _run_kopf(
    kube: Kube, s: Settings, cms: ObjectCache, stop: threading.Event, keeper: serving_tls.Keeper
) -> None:
    import kopf  # noqa: PLC0415

    from dynamiccl.operator.controller import handlers  # noqa: PLC0415

    policies = ObjectCache()
    nodes = ObjectCache(shrink_node)
    topos = ObjectCache(shrink_node_topology)
    policies.start(kube, handlers.POLICIES, stop)
    nodes.start(kube, NODES, stop)
    topos.start(kube, handlers.NODE_TOPOLOGIES, stop)
    for cache in (policies, nodes):
        await asyncio.to_thread(cache.synced.wait, 30)
    log.info("initial tables: %s", await asyncio.to_thread(configmap.warm_up))
    ca = keeper.current.ca_crt.decode() if keeper.current else ""
    rec = handlers.Reconciler(kube, cms, policies, nodes, topos, ca)
    # Versions other than the shipped one: their .npz from the ingest (it trusts the same CA).
    rec.compiler = model_fetch.RegistryCompiler(
        s.ingest_url, token_file=s.model_token_file, ca=lambda: rec.ingest_ca
    )
    # New ConfigMaps carry the current CA (the ingest endpoint serves the same certificate).
    keeper.listeners.append(lambda b: setattr(rec, "ingest_ca", b.ca_crt.decode()))
    registry = kopf.OperatorRegistry()
    # A custom registry has none of kopf's default login handlers: log in like our client does.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    handlers.register(registry, rec)
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.peering.standalone = s.peering is None
    if s.peering is not None:
        settings.peering.name = s.peering
        settings.peering.clusterwide = True
        settings.peering.mandatory = True
        settings.peering.priority = random.randint(1, 1_000_000)  # one active replica
    statuses = asyncio.create_task(
        _policy_statuses(kube, policies, handlers.POLICIES, handlers.TUNING_RUNS, s)
    )
    try:
        if s.watch_namespaces:
            await kopf.operator(registry=registry, settings=settings, namespaces=s.watch_namespaces)
        else:
            await kopf.operator(registry=registry, settings=settings, clusterwide=True)
    finally:
        statuses.cancel()


async def _policy_statuses(
    kube: Kube, policies: ObjectCache, policies_res: Resource, runs_res: Resource, s: Settings
) -> None:
    """Every policy_status.INTERVAL_S: each NCCLTuningPolicy's observedGeneration,
    matchedJobs (its TuningRuns in the watched namespaces) and Valid condition."""

    def once() -> int:
        runs = kube.list(runs_res)  # the ClusterRole may list TuningRuns everywhere
        if s.watch_namespaces:  # kopf's names or globs: count the watched ones only
            runs = [
                r
                for r in runs
                if any(
                    fnmatch.fnmatchcase(str((r.get("metadata") or {}).get("namespace", "")), p)
                    for p in s.watch_namespaces
                )
            ]
        return policy_status.sync(kube, policies_res, policies.values(), runs)

    while True:
        try:
            await asyncio.to_thread(once)
        except Exception as exc:  # the next pass retries; never take the operator down
            log.warning("policy status: %s: %s", type(exc).__name__, exc)
        await asyncio.sleep(policy_status.INTERVAL_S)


def main(s: Settings) -> None:
    """Run until interrupted."""
    _logging(s.log_json)
    _ = jobkinds.KINDS  # imported for the handlers' kinds
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_amain(s))

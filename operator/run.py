"""Start-up of ``dynamiccl operator``: caches, TLS, webhook, metrics, kopf — one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import ssl
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamiccl import constants as c
from dynamiccl.operator import annotations as job_annotations
from dynamiccl.operator import certs, configmap, jobkinds, metrics, webhook
from dynamiccl.operator.cache import (
    ObjectCache,
    shrink_config_map,
    shrink_node,
    shrink_node_topology,
)
from dynamiccl.operator.kube import CONFIGMAPS, NAMESPACES, NODES, SECRETS, Kube, NotFoundError

log = logging.getLogger("dynamiccl.operator")
CM_SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY},{c.LABEL_COMPONENT}=job-config"
MISS_WAIT_SECONDS = 1.5


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


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        )


def _logging(as_json: bool) -> None:
    handler = logging.StreamHandler()
    if as_json:
        handler.setFormatter(_JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def ensure_tls(kube: Kube, s: Settings) -> certs.Bundle:
    """The serving certificate: from --tls-dir (cert-manager) or the self-managed Secret."""
    if s.tls_dir is not None:
        try:
            return certs.Bundle(
                ca_crt=(s.tls_dir / "ca.crt").read_bytes()
                if (s.tls_dir / "ca.crt").exists()
                else b"",
                tls_crt=(s.tls_dir / "tls.crt").read_bytes(),
                tls_key=(s.tls_dir / "tls.key").read_bytes(),
            )
        except OSError as exc:
            raise StartupError(f"--tls-dir {s.tls_dir}: {exc.strerror}") from exc
    names = [*certs.service_names(s.service, s.namespace), *s.extra_sans]
    try:
        secret = kube.get(SECRETS, s.tls_secret, s.namespace)
        bundle = certs.Bundle.from_secret_data(secret.get("data") or {})
    except NotFoundError:
        secret, bundle = {}, None
    why = certs.needs_rotation(bundle, names)
    if why is not None or bundle is None:
        log.info("issuing webhook certificate: %s", why)
        bundle = certs.issue(names)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": s.tls_secret,
                "namespace": s.namespace,
                "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY},
            },
            "data": bundle.secret_data(),
        }
        if secret:
            kube.patch(SECRETS, s.tls_secret, {"data": body["data"]}, s.namespace)
        else:
            kube.create(SECRETS, body)
        metrics.CERT_ROTATIONS.inc()
    if kube.patch_webhook_ca(s.webhook_config, certs.ca_bundle_b64(bundle)):
        log.info("caBundle of MutatingWebhookConfiguration %s is current", s.webhook_config)
    return bundle


def ssl_context(bundle: certs.Bundle, ctx: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """Load the serving certificate into a (new or existing) server context."""
    ctx = ctx or ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as tmp:
        crt, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        crt.write_bytes(bundle.tls_crt)
        key.write_bytes(bundle.tls_key)
        ctx.load_cert_chain(crt, key)
    return ctx


def miss_lookup(kube: Kube, cms: ObjectCache) -> webhook.MissLookup:
    """On a cache miss: GET the ConfigMap; if the job opted in, wait briefly for it."""

    def lookup(ns: str, job: str, pod: Any) -> Any:
        name = configmap.object_name(job)
        try:
            return kube.get(CONFIGMAPS, name, ns)
        except NotFoundError:
            pass
        from dynamiccl.operator.handlers import Reconciler  # noqa: PLC0415

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
    if s.kubeconfig:
        os.environ[c.ENV_KUBECONFIG] = s.kubeconfig
    try:
        kube = Kube(s.kubeconfig)
    except Exception as exc:
        raise StartupError(f"cannot load Kubernetes credentials: {exc}") from exc
    stop = threading.Event()
    cms = ObjectCache(shrink_config_map)
    cms.start(kube, CONFIGMAPS, stop, CM_SELECTOR)
    bundle = await asyncio.to_thread(ensure_tls, kube, s)
    ctx = ssl_context(bundle)
    admission = webhook.Admission(cms, s.image, s.ingest_url, miss_lookup(kube, cms))
    stop_server = await webhook.serve(
        webhook.app(admission, ready=cms.synced.is_set), s.webhook_host, s.webhook_port, ctx
    )
    if s.metrics_port:
        from prometheus_client import start_http_server  # noqa: PLC0415

        start_http_server(s.metrics_port)
    log.info("webhook listening on https://%s:%d/mutate", s.webhook_host, s.webhook_port)
    try:
        if s.handlers:
            await _run_kopf(kube, s, cms, stop, bundle)
        else:
            await asyncio.Event().wait()
    finally:
        stop.set()
        await stop_server()


async def _run_kopf(
    kube: Kube, s: Settings, cms: ObjectCache, stop: threading.Event, bundle: certs.Bundle
) -> None:
    import kopf  # noqa: PLC0415

    from dynamiccl.operator import handlers  # noqa: PLC0415

    policies = ObjectCache()
    nodes = ObjectCache(shrink_node)
    topos = ObjectCache(shrink_node_topology)
    policies.start(kube, handlers.POLICIES, stop)
    nodes.start(kube, NODES, stop)
    topos.start(kube, handlers.NODE_TOPOLOGIES, stop)
    for cache in (policies, nodes):
        await asyncio.to_thread(cache.synced.wait, 30)
    rec = handlers.Reconciler(kube, cms, policies, nodes, topos, bundle.ca_crt.decode())
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
    await kopf.operator(registry=registry, settings=settings, clusterwide=True)


def main(s: Settings) -> None:
    """Run until interrupted."""
    _logging(s.log_json)
    _ = jobkinds.KINDS  # imported for the handlers' kinds
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_amain(s))

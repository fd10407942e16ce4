"""The mutating admission webhook: AdmissionReview v1 in, JSON patch out.

Fast and never in the way: a pod is mutated only when its job's ConfigMap
exists (the operator wrote it: opted in, a policy matched, annotations valid);
anything unexpected — no job, no ConfigMap, a malformed request, an internal
error — answers ``allowed: true`` without a patch, so the pod starts untuned
(DESIGN.md §3.1). The MutatingWebhookConfiguration adds ``failurePolicy:
Ignore`` and a ≤ 3 s timeout for the cases where we cannot answer at all.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from dynamiccl import constants as c
from dynamiccl.operator import configmap, jobkinds, jsonpatch, metrics, mutate
from dynamiccl.operator.cache import ObjectCache

log = logging.getLogger("dynamiccl.operator.webhook")

# (namespace, job name, pod) → the job's ConfigMap or None; may block (runs in a thread).
MissLookup = Callable[[str, str, Mapping[str, Any]], Mapping[str, Any] | None]


@dataclass
class Admission:
    """Decides the response to one AdmissionReview."""

    config_maps: ObjectCache
    image: str
    ingest_url: str = ""
    miss_lookup: MissLookup | None = None

    def _injection(self, job: str, cm: Mapping[str, Any]) -> mutate.Injection:
        meta = cm.get("metadata") or {}
        ann = meta.get("annotations") or {}
        return mutate.Injection(
            job_name=job,
            job_kind=str(ann.get(c.ANNOTATION_JOB_KIND, "")),
            config_map=str(meta.get("name")),
            image=self.image,
            env_knobs=configmap.read_env(cm),
            config_digest=str(ann.get(c.ANNOTATION_CONFIG_DIGEST, "")),
            ingest_url=self.ingest_url,
        )

    async def review(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The AdmissionReview response for a request body (never raises)."""
        request = body.get("request") if isinstance(body, Mapping) else None
        if not isinstance(request, Mapping):
            metrics.WEBHOOK_REQUESTS.labels(result="malformed").inc()
            return _response("", None, ["dynamiccl: malformed AdmissionReview"])
        uid = str(request.get("uid", ""))
        try:
            patch, result = await self._patch(request)
        except Exception:  # the pod must never fail because of us
            log.exception("admission of %s failed; allowing untuned", uid)
            metrics.WEBHOOK_REQUESTS.labels(result="error").inc()
            return _response(uid, None, ["dynamiccl: internal error, pod not tuned"])
        metrics.WEBHOOK_REQUESTS.labels(result=result).inc()
        return _response(uid, patch, [])

    async def _patch(self, request: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
        pod = request.get("object")
        if request.get("operation") != "CREATE" or not isinstance(pod, Mapping):
            return None, "skipped"
        if not jobkinds.trains(pod) or mutate.is_injected(pod):
            return None, "skipped"
        job = jobkinds.job_name_of_pod(pod)
        if job is None:
            return None, "no-job"
        ns = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
        name = configmap.object_name(job)
        cm = self.config_maps.get(ns, name)
        if cm is None and self.miss_lookup is not None:
            cm = await asyncio.to_thread(self.miss_lookup, ns, job, pod)
        if cm is None:
            return None, "untuned"
        mutated = mutate.mutate_pod(pod, self._injection(job, cm))
        return jsonpatch.diff(dict(pod), mutated), "mutated"


def _response(uid: str, patch: list[dict[str, Any]] | None, warnings: list[str]) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def app(admission: Admission, ready: Callable[[], bool] = lambda: True) -> web.Application:
    """The aiohttp application: POST /mutate, GET /healthz, GET /readyz."""

    async def mutate_handler(request: web.Request) -> web.Response:
        start = time.perf_counter()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = {}
        out = await admission.review(body)
        metrics.WEBHOOK_SECONDS.observe(time.perf_counter() - start)
        return web.json_response(out)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="syncing")

    application = web.Application(client_max_size=4 * 1024 * 1024)
    application.router.add_post("/mutate", mutate_handler)
    application.router.add_get("/healthz", healthz)
    application.router.add_get("/readyz", readyz)
    return application


async def serve(
    application: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> Callable[[], Awaitable[None]]:
    """Start serving; returns the coroutine function that stops the server."""
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    return runner.cleanup

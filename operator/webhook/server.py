"""The mutating admission webhook: AdmissionReview v1 in, JSON patch out.

Fast and never in the way: a pod is mutated only when its job's ConfigMap
exists (the operator wrote it: opted in, a policy matched, annotations valid);
anything unexpected — no job, no ConfigMap, a malformed request, an internal
error — answers ``allowed: true`` without a patch, so the pod starts untuned
(docs/architecture.md, 'Invariants'). The MutatingWebhookConfiguration adds ``failurePolicy:
Ignore`` and a ≤ 3 s timeout for the cases where we cannot answer at all.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dynamiccl import constants as c
from dynamiccl.operator import metrics
from dynamiccl.operator.controller import configmap, jobkinds
from dynamiccl.operator.controller.cache import ObjectCache
from dynamiccl.operator.webhook import mutate
from dynamiccl.operator.webhook.patch import diff

log = logging.getLogger("dynamiccl.operator.webhook.server")

# (namespace, job name, pod) → the job's ConfigMap or None; may block (runs in a thread).
MissLookup = Callable[[str, str, Mapping[str, Any]], Mapping[str, Any] | None]

# Every answer leaves within this many seconds of the request's arrival, whatever the
# cache-miss lookups are doing (the chart's timeoutSeconds is at most 3 s; past it the
# apiserver applies failurePolicy Ignore, and the pod waited the full timeout for it).
# Under a burst the lookups queue for the server's threads: a request whose lookup has
# not returned by then is answered untuned.
ANSWER_BUDGET_S = 2.5


@dataclass
class Admission:
    """Decides the response to one AdmissionReview."""

    config_maps: ObjectCache
    image: str
    ingest_url: str = ""
    miss_lookup: MissLookup | None = None
    answer_budget_s: float = ANSWER_BUDGET_S
    # the cache-miss lookups in flight, one per (namespace, job): a job's pods created in one
    # burst before its ConfigMap reaches the cache share one lookup instead of one each
    _misses: dict[tuple[str, str], asyncio.Future[Mapping[str, Any] | None]] = field(
        default_factory=dict, init=False, repr=False
    )

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
            topo_file=c.TOPO_FILE_NODES_KEY in (cm.get("binaryData") or {}),
        )

    async def review(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The AdmissionReview response for a request body (never raises)."""
        request = body.get("request") if isinstance(body, Mapping) else None
        if not isinstance(request, Mapping):
            metrics.WEBHOOK_REQUESTS.labels(result="malformed").inc()
            return _response("", None, ["dynamiccl: malformed AdmissionReview"])
        uid = str(request.get("uid", ""))
        deadline = time.monotonic() + self.answer_budget_s
        try:
            patch, result = await self._patch(request, deadline)
        except Exception:  # the pod must never fail because of us
            log.exception("admission of %s failed; allowing untuned", uid)
            metrics.WEBHOOK_REQUESTS.labels(result="error").inc()
            return _response(uid, None, ["dynamiccl: internal error, pod not tuned"])
        metrics.WEBHOOK_REQUESTS.labels(result=result).inc()
        return _response(uid, patch, [])

    async def _patch(
        self, request: Mapping[str, Any], deadline: float
    ) -> tuple[list[dict[str, Any]] | None, str]:
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
            try:
                cm = await asyncio.wait_for(
                    asyncio.shield(self._lookup(ns, job, pod)),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
            except TimeoutError:
                return None, "miss-timeout"
        if cm is None:
            return None, "untuned"
        owner = jobkinds.job_uid_of_pod(pod)
        if owner is not None and not configmap.is_of_job(cm, owner):  # a deleted job's
            return None, "stale-config"
        mutated = mutate.mutate_pod(pod, self._injection(job, cm))
        return diff(dict(pod), mutated), "mutated"

    def _lookup(
        self, ns: str, job: str, pod: Mapping[str, Any]
    ) -> asyncio.Future[Mapping[str, Any] | None]:
        """The job's cache-miss lookup: the one in flight for (namespace, job), else a new one
        in a thread (its result is the job's ConfigMap whichever of its pods asked: each
        pod's owner is checked against it after). A waiter that gives up (its answer budget)
        does not cancel it for the others (`asyncio.shield`)."""
        key = (ns, job)
        running = self._misses.get(key)
        if running is not None:
            return running
        assert self.miss_lookup is not None
        started = asyncio.ensure_future(asyncio.to_thread(self.miss_lookup, ns, job, pod))
        self._misses[key] = started

        def done(f: asyncio.Future[Mapping[str, Any] | None]) -> None:
            self._misses.pop(key, None)
            if not f.cancelled():
                f.exception()  # retrieved: every waiter may have given up already

        started.add_done_callback(done)
        return started


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


class ServerThread:
    """The webhook's aiohttp server on its own event loop, in its own daemon thread.

    kopf's watches and handlers run on the operator's main event loop; sharing it,
    an admission request waits behind whatever kopf is processing (measured with
    ``benchmarks/webhook_bench.py --handlers``: a burst of pod events put the
    webhook's p99 at ~700 ms). On its own loop it only competes for the GIL, which
    CPython hands over every 5 ms at most. Blocking work of the webhook (cache-miss
    lookups) runs in this loop's own thread pool.
    """

    def __init__(
        self,
        application: web.Application,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        threads: int = 32,
    ) -> None:
        self._app, self._host, self._port, self._ssl = application, host, port, ssl_context
        self._threads = threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.port = 0  # the bound port (useful with port 0)

    def start(self, timeout: float = 60.0) -> None:
        """Blocking: listen, or raise what prevented it (e.g. OSError: address in use)."""
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"webhook server not listening after {timeout:.0f}s")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(self._threads, thread_name_prefix="webhook")
        )
        runner = web.AppRunner(self._app, access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self._host, self._port, ssl_context=self._ssl)
            loop.run_until_complete(site.start())
        except BaseException as exc:
            self._error = exc
            loop.run_until_complete(runner.cleanup())
            loop.close()
            self._ready.set()
            return
        self.port = int(runner.addresses[0][1])
        self._loop = loop
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            for task in asyncio.all_tasks(loop):  # cache-miss lookups nobody waits for
                task.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Blocking: stop serving (open requests are cut) and wait for the thread."""
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)

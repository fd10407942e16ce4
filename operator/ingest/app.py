"""The reward-ingest HTTPS endpoint: `POST /v1/rewards` (aiohttp).

A sidecar sends one `RewardBatch` (dynamiccl/api/rewards.py) with
`Authorization: Bearer <projected SA token, audience dynamiccl-ingest>`.
Checks, in order, each answered before anything is stored:

    401  no / malformed bearer token, or the API server does not authenticate it
         (forged, expired, wrong audience, pod deleted)
    413  body larger than MAX_BATCH_BODY_BYTES (checked before reading it)
    415  not application/json, or a body that is not JSON
    422  not a valid RewardBatch (strict pydantic; the first error is named)
    403  token of another namespace / pod, a pod that is not in the reported job (every
         owner up to the job is read and must carry the uid the pod names), a job
         DynamICCL does not tune, or a model version other than the one it assigned
    409  idempotency key already used for a different payload
    429  the pod or its job sent more records than its rate limit allows (Retry-After;
         operator/ingest/ratelimit.py)
    503  the API server or the store is unavailable, or the store is behind: a batch would
         wait more than OVERLOAD_S for its commit (nothing stored; Retry-After: retry then)
    200  {"accepted": <records stored>, "duplicate": <bool>} after the commit

Storing is all-or-nothing per batch (operator/store/experience.py); retries with the same
idempotency key answer 200 with `duplicate: true` and store nothing.
Metrics: `dynamiccl_ingest_*` (prometheus-client) on `GET /metrics`.
"""

from __future__ import annotations

import math
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.aiohttp import make_aiohttp_handler
from pydantic import ValidationError

from dynamiccl import constants as c
from dynamiccl.api.rewards import (
    MAX_BATCH_BODY_BYTES,
    IngestResponse,
    RewardBatch,
)
from dynamiccl.operator.ingest import http_answers
from dynamiccl.operator.ingest.auth import (
    NOT_CHECKED,
    AuthBackendUnavailable,
    CachingTunedJobs,
    Caller,
    NotChecked,
    PodJobResolver,
    TokenReviewer,
    TunedJobs,
    authorize,
)
from dynamiccl.operator.ingest.model_serve import ROUTE as MODELS_ROUTE
from dynamiccl.operator.ingest.model_serve import ModelServer
from dynamiccl.operator.ingest.ratelimit import RateLimiter
from dynamiccl.operator.ingest.tls import server_context
from dynamiccl.operator.ingest.writer import OVERLOAD_S, BatchWriter
from dynamiccl.operator.store.experience import IdempotencyConflict

RETRY_AFTER_S: Final = "2"


class IngestMetrics:
    """`dynamiccl_ingest_*` metrics in one registry (one per server instance)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dynamiccl_ingest_requests",
            "Reward-ingest requests by HTTP status",
            ["code"],
            registry=r,
        )
        self.rejected = Counter(
            "dynamiccl_ingest_rejected",
            "Rejected ingest requests by reason",
            ["reason"],
            registry=r,
        )
        self.records = Counter("dynamiccl_ingest_records", "Reward records stored", registry=r)
        self.calls = Counter(
            "dynamiccl_ingest_collective_calls",
            "Collective calls covered by stored records",
            registry=r,
        )
        self.duplicates = Counter(
            "dynamiccl_ingest_duplicate_batches", "Batches recognised as retries", registry=r
        )
        self.duration = Histogram(
            "dynamiccl_ingest_request_duration_seconds",
            "Time to answer an ingest request",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.model_requests = Counter(
            "dynamiccl_ingest_model_requests",
            "GET /v1/models/<version>.npz requests (the operator fetching models) by HTTP status",
            ["code"],
            registry=r,
        )
        self.leader = Gauge(
            "dynamiccl_ingest_learning_leader",
            "1 while this replica holds the Lease and runs the learning loop",
            registry=r,
        )
        self.group = Histogram(
            "dynamiccl_ingest_commit_group_batches",
            "Batches committed per store transaction (group commit)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )


@dataclass(frozen=True)
class IngestConfig:
    """Static settings of the endpoint."""

    audience: str = c.INGEST_AUDIENCE
    max_body_bytes: int = MAX_BATCH_BODY_BYTES


def _first_error(exc: ValidationError) -> str:
    errs = exc.errors(include_url=False, include_input=False)
    if not errs:
        return "invalid payload"
    first = errs[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "(body)"
    more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


class IngestHandler:
    """The request handler; dependencies injected (auth interfaces, writer, metrics)."""

    def __init__(
        self,
        *,
        reviewer: TokenReviewer,
        resolver: PodJobResolver,
        writer: BatchWriter,
        metrics: IngestMetrics,
        config: IngestConfig | None = None,
        tuned: TunedJobs | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.reviewer = reviewer
        self.resolver = resolver
        self.tuned = tuned  # None: no model-version check (tests, the demo)
        self.limiter = limiter  # None: no rate limit (tests, the demo)
        self.writer = writer
        self.metrics = metrics
        self.config = config or IngestConfig()

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one `POST /v1/rewards`."""
        t0 = time.perf_counter()
        resp = await self._handle(request)
        self.metrics.requests.labels(code=str(resp.status)).inc()
        self.metrics.duration.observe(time.perf_counter() - t0)
        return resp

    def _reject(self, status: int, reason: str, detail: str = "", **hdr: str) -> web.Response:
        self.metrics.rejected.labels(reason=reason).inc()
        return http_answers.error(status, reason, detail, **hdr)

    async def _handle(self, request: web.Request) -> web.Response:
        token = http_answers.bearer_token(request)
        if token is None:
            return self._reject(
                401, "unauthenticated", "missing bearer token", **{"WWW-Authenticate": "Bearer"}
            )
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._reject(413, "too_large", f"body exceeds {limit} bytes")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._reject(413, "too_large", f"body exceeds {limit} bytes")
        if len(body) > limit:
            return self._reject(413, "too_large", f"body exceeds {limit} bytes")
        try:
            caller = await self.reviewer.review(token, self.config.audience)
        except AuthBackendUnavailable as exc:
            return self._reject(503, "auth_unavailable", str(exc), **{"Retry-After": RETRY_AFTER_S})
        if caller is None:
            return self._reject(
                401, "unauthenticated", "token not valid", **{"WWW-Authenticate": "Bearer"}
            )
        if request.content_type != "application/json":
            return self._reject(415, "unsupported_media_type", "send application/json")
        try:
            batch = RewardBatch.model_validate_json(body)
        except ValidationError as exc:
            if exc.errors(include_url=False)[0]["type"] == "json_invalid":
                return self._reject(415, "unsupported_media_type", "the body is not JSON")
            return self._reject(422, "malformed", _first_error(exc))
        try:
            denied = await self._authorize(caller, batch)
        except AuthBackendUnavailable as exc:
            return self._reject(503, "auth_unavailable", str(exc), **{"Retry-After": RETRY_AFTER_S})
        if denied is not None:
            return self._reject(403, "forbidden", denied)
        backlog = self.writer.backlog_s()  # before the rate limit: a 503 costs no tokens
        if backlog > OVERLOAD_S:
            wait = str(max(1, math.ceil(backlog)))
            return self._reject(
                503, "overloaded", f"the store is {backlog:.1f} s behind", **{"Retry-After": wait}
            )
        limited = self._rate_limited(batch)
        if limited is not None:
            return limited
        try:
            out = await self.writer.submit(batch)
        except IdempotencyConflict as exc:
            return self._reject(409, "conflict", str(exc))
        except Exception as exc:
            return self._reject(
                503, "store_unavailable", type(exc).__name__, **{"Retry-After": RETRY_AFTER_S}
            )
        if out.duplicate:
            self.metrics.duplicates.inc()
        else:
            self.metrics.records.inc(out.accepted)
            self.metrics.calls.inc(batch.calls)
        return web.Response(
            text=IngestResponse(accepted=out.accepted, duplicate=out.duplicate).model_dump_json(),
            content_type="application/json",
        )

    def _rate_limited(self, batch: RewardBatch) -> web.Response | None:
        """The 429 answer when the pod or its job is over its rate limit, else None."""
        if self.limiter is None:
            return None
        over = self.limiter.admit(
            batch.pod.uid, batch.job.uid, len(batch.records) + len(batch.events)
        )
        if over is None:
            return None
        what, wait_s = over
        lim = self.limiter.limit(what)
        who = "the cluster" if what == "store" else f"this {what}"
        return self._reject(
            429,
            "rate_limited",
            f"{who} sent more than {lim.rate:g} records/s "
            f"(burst {lim.burst:g}); retry in {wait_s} s",
            **{"Retry-After": str(wait_s)},
        )

    async def _authorize(self, caller: Caller, batch: RewardBatch) -> str | None:
        """None when the caller may store the batch, else why not (AuthBackendUnavailable)."""
        if (caller.namespace, caller.pod_name, caller.pod_uid) != (
            batch.job.namespace,
            batch.pod.name,
            batch.pod.uid,
        ):
            return authorize(caller, batch, None)
        job = await self.resolver.job_of_pod(batch.job.namespace, batch.pod.name, batch.pod.uid)
        assigned: str | NotChecked | None = NOT_CHECKED
        if job is not None and job == batch.job and self.tuned is not None:
            assigned = await self.tuned.assigned_model(job)
            if (
                assigned != batch.model_version
                and isinstance(self.tuned, CachingTunedJobs)
                and self.tuned.refresh(job)
            ):  # a rollout may have just changed the version: ask once more
                assigned = await self.tuned.assigned_model(job)
        return authorize(caller, batch, job, assigned)


def build_app(handler: IngestHandler, models: ModelServer | None = None) -> web.Application:
    """The aiohttp application: POST /v1/rewards, GET /healthz, GET /metrics,
    and with `models` GET /v1/models/{version}.npz (operator/ingest/model_serve.py)."""
    app = web.Application(client_max_size=handler.config.max_body_bytes)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_post(c.INGEST_PATH, handler.handle)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", make_aiohttp_handler(handler.metrics.registry))
    if models is not None:
        served = models

        async def model(request: web.Request) -> web.StreamResponse:
            resp = await served.handle(request)
            handler.metrics.model_requests.labels(code=str(resp.status)).inc()
            return resp

        app.router.add_get(MODELS_ROUTE, model)
    return app


def server_ssl_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """TLS ≥ 1.2 server context from a PEM certificate (chain) and key (loaded once; the
    ingest process reloads its certificate: operator/ingest/tls.py)."""
    return server_context(cert_file, key_file)


async def start_server(
    app: web.Application, *, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> tuple[web.AppRunner, int]:
    """Serve `app`; returns the runner (call `cleanup()` to stop) and the bound port."""
    sock = socket.create_server((host, port), backlog=1024, reuse_port=False)
    bound = int(sock.getsockname()[1])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock, ssl_context=ssl_context)
    await site.start()
    return runner, bound

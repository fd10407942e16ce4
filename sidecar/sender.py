"""Sending reward batches to the operator's ingest endpoint (HTTPS, projected SA token).

`post` sends one batch and classifies the answer; `SendLoop` drains the spool's
outbox oldest first, resending the *same bytes* (same idempotency key
``<pod-uid>/<seq>``) until the endpoint answers, with exponential backoff and
jitter. The token is read from its file before every request: the kubelet
rotates projected tokens in place. A `Retry-After` is obeyed: the next try of
that batch waits at least that long (plus up to a quarter more, so sidecars told
the same do not return together), and `pace` (sidecar/pace.py) stretches the cut
interval on 429 / 503. Answers (docs/learning-loop.md):

- 200: stored now (``duplicate: false``) or earlier (``true``) → acknowledged;
- 503, 5xx, 429, timeouts, connection errors, and 401 / 403 (a token not yet
  valid, a pod the operator cannot resolve yet) → retried;
- 400 / 409 / 413 / 415 / 422: the batch itself is refused → parked in
  ``rejected/`` (resending identical bytes cannot succeed).
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import urlsplit

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.pace import DEFAULT_FLUSH_S, Pace
from dynamiccl.sidecar.spool import Spool

log = logging.getLogger("dynamiccl.sidecar.sender")

PERMANENT: Final = frozenset({400, 409, 413, 415, 422})
BACKOFF_MIN_S: Final = 0.2
BACKOFF_MAX_S: Final = 30.0


@dataclass(frozen=True)
class Answer:
    """One request's outcome."""

    status: int  # 0: no HTTP answer (connection / TLS / timeout)
    accepted: int = 0
    duplicate: bool = False
    detail: str = ""
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def permanent(self) -> bool:
        return self.status in PERMANENT


class Poster(Protocol):
    """What sends one batch: `Client`, or a stand-in that hands the bytes on."""

    def post(self, body: bytes) -> Answer:
        """POST one batch; never raises for network trouble (status 0)."""
        ...


class Client:
    """One keep-alive HTTPS (or HTTP, for local debugging) connection to the endpoint."""

    def __init__(
        self, url: str, token_file: Path, ca_file: Path | None, timeout_s: float = 10.0
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"ingest URL must be https://host[:port]/path, got {url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.path = parts.path or "/v1/rewards"
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.scheme == "https":
                ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout_s, context=ctx
                )
            else:
                self._conn = http.client.HTTPConnection(
                    self.host, self.port, timeout=self.timeout_s
                )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def post(self, body: bytes) -> Answer:
        """POST one batch; never raises for network trouble (status 0)."""
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            return Answer(0, detail=f"token file {self.token_file}: {exc.strerror}")
        if not token:  # caught mid-rewrite (a non-atomic writer): try again shortly
            return Answer(0, detail=f"token file {self.token_file} is empty")
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        try:
            conn = self._connect()
            conn.request("POST", self.path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            self.close()  # a fresh connection (and TLS context) next time
            return Answer(0, detail=f"{type(exc).__name__}: {exc}")
        retry = resp.getheader("Retry-After")
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        return Answer(
            resp.status,
            accepted=int(doc.get("accepted", 0) or 0),
            duplicate=bool(doc.get("duplicate", False)),
            detail=str(doc.get("detail") or doc.get("error") or ""),
            retry_after_s=float(retry) if retry and retry.replace(".", "", 1).isdigit() else None,
        )


def batch_size(body: bytes) -> tuple[int, int]:
    """(collective calls, records) a batch body carries."""
    b = RewardBatch.model_validate_json(body)
    return b.calls, len(b.records)


class SendLoop:
    """The sender thread: outbox → endpoint, with backoff; `stop()` ends it."""

    def __init__(
        self,
        spool: Spool,
        client: Poster | None,
        metrics: AgentMetrics,
        *,
        idle_s: float = 0.2,
        sleep: Callable[[float], bool] | None = None,
        rng: random.Random | None = None,
        pace: Pace | None = None,
    ) -> None:
        self.spool = spool
        self.pace = pace or Pace(DEFAULT_FLUSH_S, 1)
        self.client = client
        self.metrics = metrics
        self.idle_s = idle_s
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._rng = rng or random.Random()
        self._backoff = 0.0
        self.last_error = ""

    def stop(self) -> None:
        self._stop.set()

    def _delay(self, answer: Answer) -> float:
        self._backoff = min(max(self._backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
        if answer.retry_after_s is not None:  # never earlier than the endpoint asked
            return answer.retry_after_s * (1.0 + self._rng.random() / 4)
        return self._backoff * (0.5 + self._rng.random() / 2)

    def send_one(self, seq: int) -> Answer | None:
        """Try one batch; returns the answer (None: nothing to send)."""
        body = self.spool.read_batch(seq)
        if body is None or self.client is None:
            return None
        t0 = time.monotonic()
        answer = self.client.post(body)
        self.metrics.send_duration.observe(time.monotonic() - t0)
        self.metrics.requests.labels(code=str(answer.status)).inc()
        self.pace.observe(answer.status, answer.retry_after_s)
        if answer.ok:
            calls, records = batch_size(body)
            tot = self.spool.ack(seq, calls, records)
            self.metrics.batches_acked.labels(duplicate=str(answer.duplicate).lower()).inc()
            self.metrics.acked_calls.set(tot.calls)
            self.metrics.acked_batches.set(tot.batches)
            self._backoff = 0.0
            self.last_error = ""
        elif answer.permanent:
            log.error("ingest refused batch %d for good (%d %s)", seq, answer.status, answer.detail)
            self.spool.reject(seq, f"{answer.status} {answer.detail}")
            self.metrics.batches_rejected.labels(code=str(answer.status)).inc()
        else:
            self.last_error = f"{answer.status} {answer.detail}".strip()
        return answer

    def drain(
        self, deadline: float | None = None, sleep: Callable[[float], bool] | None = None
    ) -> bool:
        """Send everything in the outbox, retrying with backoff; gives up when the next retry
        would pass `deadline` or `sleep` (default: wait for `stop()`) returns True.
        True when the outbox is empty."""
        wait = sleep or self._sleep
        while True:
            pending = self.spool.outbox()
            self.metrics.outbox.set(len(pending))
            if not pending:
                return True
            answer = self.send_one(pending[0])
            if answer is None:
                return False
            if not answer.ok and not answer.permanent:
                delay = self._delay(answer)
                log.warning("ingest: %s; retrying in %.1fs", self.last_error, delay)
                if deadline is not None and time.monotonic() + delay > deadline:
                    return False
                if wait(delay):
                    return False

    def run(self) -> None:
        """Until `stop()`: drain, then wait a little for new batches."""
        while not self._stop.is_set():
            try:
                self.drain()
            except Exception:  # never let the thread die: rewards wait in the outbox
                log.exception("sender failed; retrying")
                self._sleep(BACKOFF_MAX_S / 10)
            self._sleep(self.idle_s)

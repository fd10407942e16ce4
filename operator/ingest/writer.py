"""Group commit for the ingest endpoint: many concurrent requests, one transaction.

Requests hand their validated batch to `BatchWriter.submit` and wait. One
worker thread (the store's single writer) takes everything pending — up to
`max_group` batches — and stores it with `ExperienceStore.insert_batches`: one
transaction, one fsync. Every waiter is answered only after that commit
returned, so a 2xx always means "durable" (docs/learning-loop.md, 'Endpoint
answers'). If the commit fails, every batch of the group gets the error (nothing
of it was written) and its client retries.

`backlog_s()` estimates how long a batch submitted now would wait for its commit
(batches waiting x the recent store seconds per batch): past `OVERLOAD_S` the
endpoint answers 503 with that as Retry-After instead of queueing more
(operator/ingest/app.py), and the sidecars stretch their flush interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.store.experience import ExperienceStore, IdempotencyConflict, InsertOutcome

DEFAULT_MAX_GROUP: Final = 64
OVERLOAD_S: Final = 2.0  # a batch would wait longer than this: 503 + Retry-After
EWMA: Final = 0.2  # weight of the newest commit in the seconds-per-batch estimate

Pending = tuple[RewardBatch, "asyncio.Future[InsertOutcome]"]


class BatchWriter:
    """Serialises writes to the store on one thread, committing waiting batches together."""

    def __init__(
        self,
        store: ExperienceStore,
        *,
        max_group: int = DEFAULT_MAX_GROUP,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._max_group = max_group
        self._on_commit = on_commit
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-writer")
        self._pending: list[Pending] = []
        self._in_flight = 0
        self._s_per_batch = 0.0  # recent store seconds per committed batch
        self._flusher: asyncio.Task[None] | None = None

    def backlog_s(self) -> float:
        """Seconds a batch submitted now would wait for its commit (an estimate)."""
        return (len(self._pending) + self._in_flight) * self._s_per_batch

    async def submit(self, batch: RewardBatch) -> InsertOutcome:
        """Store the batch (or recognise it as a duplicate); IdempotencyConflict on a reused key."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[InsertOutcome] = loop.create_future()
        self._pending.append((batch, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            group = self._pending[: self._max_group]
            del self._pending[: self._max_group]
            self._in_flight = len(group)
            t0 = time.perf_counter()
            try:
                outs = await loop.run_in_executor(
                    self._executor, self._store.insert_batches, [b for b, _ in group]
                )
            except Exception as exc:
                self._in_flight = 0
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self._in_flight = 0
            took = (time.perf_counter() - t0) / len(group)
            self._s_per_batch += EWMA * (took - self._s_per_batch)
            if self._on_commit is not None:
                self._on_commit(len(group))
            for (_, fut), out in zip(group, outs, strict=True):
                if fut.done():  # the request was cancelled (client went away)
                    continue
                if isinstance(out, IdempotencyConflict):
                    fut.set_exception(out)
                else:
                    fut.set_result(out)

    async def close(self) -> None:
        """Finish what is pending, then stop the writer thread."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
        self._executor.shutdown(wait=True)

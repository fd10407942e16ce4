"""Group commit: concurrent submissions share transactions; failures reach every waiter."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.ingest.writer import BatchWriter
from dynamiccl.operator.store.experience import (
    ExperienceStore,
    IdempotencyConflict,
    InsertOutcome,
    open_store,
)


def make(seq: int, count: int = 1) -> RewardBatch:
    return RewardBatch.model_validate(
        {
            "idempotency_key": f"pod-1/{seq}",
            "job": {"namespace": "ns", "kind": "PyTorchJob", "name": "j", "uid": "ju"},
            "pod": {"name": "p", "uid": "pod-1"},
            "model_version": "v1",
            "table_version": 0,
            "records": [
                {
                    "collective": "allgather",
                    "size_bucket": 3,
                    "nbytes_min": 8,
                    "nbytes_max": 15,
                    "nranks": 2,
                    "nnodes": 1,
                    "algo": "ring",
                    "proto": "ll",
                    "nchannels": 1,
                    "chunk_bytes": 0,
                    "origin": "table",
                    "count": count,
                    "mean_time_us": 3.0,
                    "p50_time_us": 3.0,
                    "p99_time_us": 4.0,
                    "busbw_GBps": 0.1,
                    "nccl_default_time_us": 3.5,
                }
            ],
        }
    )


class RecordingStore:
    """Wraps a real store; records the size of every transaction."""

    def __init__(self, inner: ExperienceStore, fail: bool = False) -> None:
        self.inner = inner
        self.groups: list[int] = []
        self.fail = fail

    def insert_batches(
        self, batches: Sequence[RewardBatch]
    ) -> list[InsertOutcome | IdempotencyConflict]:
        self.groups.append(len(batches))
        if self.fail:
            raise RuntimeError("disk full")
        return self.inner.insert_batches(batches)


@pytest.fixture
def store(tmp_path: Path) -> ExperienceStore:
    return open_store(str(tmp_path / "w.db"))


def test_concurrent_submissions_are_grouped(store: ExperienceStore) -> None:
    rec = RecordingStore(store)
    commits: list[int] = []

    async def run() -> list[InsertOutcome | BaseException]:
        w = BatchWriter(rec, max_group=16, on_commit=commits.append)  # type: ignore[arg-type]
        subs = [w.submit(make(i)) for i in range(40)] + [w.submit(make(3))]
        subs.append(w.submit(make(4, count=99)))  # conflicts with batch 4
        out = await asyncio.gather(*subs, return_exceptions=True)
        await w.close()
        return out

    out = asyncio.run(run())
    assert sum(rec.groups) == 42
    assert max(rec.groups) == 16  # grouped, bounded by max_group
    assert len(rec.groups) < 42
    assert commits == rec.groups
    assert all(isinstance(o, InsertOutcome) and not o.duplicate for o in out[:40])
    assert out[40] == InsertOutcome(0, True)
    assert isinstance(out[41], IdempotencyConflict)
    assert store.count_experience() == 40


def test_a_failed_commit_fails_every_waiter(store: ExperienceStore) -> None:
    rec = RecordingStore(store, fail=True)

    async def run() -> list[InsertOutcome | BaseException]:
        w = BatchWriter(rec)  # type: ignore[arg-type]
        out = await asyncio.gather(*(w.submit(make(i)) for i in range(5)), return_exceptions=True)
        await w.close()
        return out

    out = asyncio.run(run())
    assert all(isinstance(o, RuntimeError) for o in out)
    assert store.count_experience() == 0

"""What the experience store's contract tests share: records, batches, a settable clock, and
the `store_url` / `make_store` fixtures (test_store_postgres.py overrides `store_url` to run
the same tests on PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.store.experience import ExperienceStore, open_store

MakeStore = Callable[..., ExperienceStore]


class FakeClock:
    """A clock that reads what the test set."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def rec(i: int = 0, **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "collective": "allreduce",
        "size_bucket": 20 + (i % 8),
        "nbytes_min": 1 << (20 + (i % 8)),
        "nbytes_max": (2 << (20 + (i % 8))) - 1,
        "nranks": 8,
        "nnodes": 1,
        "algo": "ring",
        "proto": "simple",
        "nchannels": i // 8,
        "chunk_bytes": 0,
        "origin": "table",
        "count": 10 + i,
        "mean_time_us": 100.0 + i,
        "p50_time_us": 99.0 + i,
        "p99_time_us": 150.0 + i,
        "busbw_GBps": 100.0,
        "nccl_default_time_us": 120.0 + i,
    }
    r.update(over)
    return r


def make_batch(
    seq: int,
    records: list[dict[str, Any]] | None = None,
    *,
    pod_uid: str = "pod-uid-0",
    job_uid: str = "job-uid-0",
    model_version: str = "v1",
    events: list[dict[str, Any]] | None = None,
) -> RewardBatch:
    return RewardBatch.model_validate(
        {
            "idempotency_key": f"{pod_uid}/{seq}",
            "job": {"namespace": "team-a", "kind": "PyTorchJob", "name": "llm", "uid": job_uid},
            "pod": {"name": f"llm-{pod_uid}", "uid": pod_uid},
            "model_version": model_version,
            "table_version": 1,
            "records": [rec(i) for i in range(3)] if records is None else records,
            "events": events or [],
        }
    )


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'experience.db'}"


@pytest.fixture
def make_store(store_url: str) -> Iterator[MakeStore]:
    opened: list[ExperienceStore] = []

    def make(**kw: Any) -> ExperienceStore:
        s = open_store(store_url, **kw)
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()

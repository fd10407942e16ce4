"""Training's read-only view of the experience store equals what the operator stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.api.experience import (
    StoreKind,
    StoreURLError,
    parse_store_url,
    read_experience,
)
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.store.experience import open_store


def batch(seq: int, n: int) -> RewardBatch:
    return RewardBatch.model_validate(
        {
            "idempotency_key": f"pod-a/{seq}",
            "job": {"namespace": "ns", "kind": "MPIJob", "name": "m", "uid": "job-m"},
            "pod": {"name": "m-worker-0", "uid": "pod-a"},
            "model_version": "default",
            "table_version": 4,
            "records": [
                {
                    "collective": "reducescatter",
                    "size_bucket": 8 + i,
                    "nbytes_min": 1 << (8 + i),
                    "nbytes_max": (2 << (8 + i)) - 1,
                    "nranks": 16,
                    "nnodes": 2,
                    "algo": "pat",
                    "proto": "simple",
                    "nchannels": 2,
                    "chunk_bytes": 65536,
                    "origin": "explore",
                    "count": 3 + i,
                    "mean_time_us": 10.5 + i,
                    "p50_time_us": 10.0 + i,
                    "p99_time_us": 20.0 + i,
                    "busbw_GBps": 1.25,
                    "nccl_default_time_us": 11.0 + i,
                }
                for i in range(n)
            ],
        }
    )


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("/data/e.db", (StoreKind.SQLITE, "/data/e.db")),
        ("sqlite:////data/e.db", (StoreKind.SQLITE, "/data/e.db")),
        ("sqlite:///rel.db", (StoreKind.SQLITE, "rel.db")),
        ("postgresql://u@h/db", (StoreKind.POSTGRES, "postgresql://u@h/db")),
        ("postgres://h/db", (StoreKind.POSTGRES, "postgres://h/db")),
    ],
)
def test_parse_store_url(url: str, want: tuple[StoreKind, str]) -> None:
    assert parse_store_url(url) == want


@pytest.mark.parametrize("url", ["", "redis://x", "s3://bucket/e.db"])
def test_bad_store_urls(url: str) -> None:
    with pytest.raises(StoreURLError, match="store URL"):
        parse_store_url(url)


def test_reader_sees_exactly_what_was_stored(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    store = open_store(f"sqlite:///{db}")
    try:
        batches = [batch(s, 7) for s in range(5)]
        for b in batches:
            store.insert_batch(b)
        rows = list(read_experience(str(db), page=4))  # several pages
        assert [r.record for r in rows] == [rec for b in batches for rec in b.records]
        assert rows == store.experience_since(0)
        cursor = rows[10].id
        assert [r.id for r in read_experience(f"sqlite:///{db}", after_id=cursor)] == [
            r.id for r in rows[11:]
        ]
        assert {(r.job_kind, r.model_version, r.table_version) for r in rows} == {
            ("MPIJob", "default", 4)
        }
    finally:
        store.close()


def test_reader_never_creates_a_store(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(read_experience(str(tmp_path / "missing.db")))
    assert not (tmp_path / "missing.db").exists()

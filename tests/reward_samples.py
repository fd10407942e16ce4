"""Reward batches as sidecars send them, for tests that need stored experience.

`record(bucket)` is one aggregated row (defaults: allgather, ring/LL128 from the
table, 100 calls at 40 us where NCCL's default is estimated at 50 us, i.e.
1.25x); `batch(...)` wraps rows the way `POST /v1/rewards` receives them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dynamiccl.api.rewards import RewardBatch


def record(size_bucket: int, **over: Any) -> dict[str, Any]:
    """One aggregated row for messages of `size_bucket` (2^b .. 2^(b+1)-1 bytes)."""
    return {
        "collective": "allgather",
        "size_bucket": size_bucket,
        "nbytes_min": 1 << size_bucket,
        "nbytes_max": (2 << size_bucket) - 1,
        "nranks": 16,
        "nnodes": 2,
        "algo": "ring",
        "proto": "ll128",
        "nchannels": 0,
        "chunk_bytes": 0,
        "origin": "table",
        "count": 100,
        "mean_time_us": 40.0,
        "p50_time_us": 39.0,
        "p99_time_us": 55.0,
        "busbw_GBps": 20.0,
        "nccl_default_time_us": 50.0,
        **over,
    }


def batch(
    key: str,
    job: Mapping[str, str],
    pod: Mapping[str, str],
    records: Sequence[Mapping[str, Any]],
    *,
    model_version: str = "default",
    table_version: int = 1,
) -> RewardBatch:
    """A validated batch: `job` = namespace/kind/name/uid, `pod` = name/uid."""
    return RewardBatch.model_validate(
        {
            "idempotency_key": key,
            "job": dict(job),
            "pod": dict(pod),
            "model_version": model_version,
            "table_version": table_version,
            "records": list(records),
        }
    )

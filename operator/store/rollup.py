"""Roll experience up: one row per job, cell, configuration and day, once it was trained on.

A sidecar sends one record per (cell, configuration) per cut interval, and
every pod of a job sends its own: a month of a large cluster is billions of
rows saying the same thing many times. The retention pass (leader only) folds
rows that are

- older than `older_than_s`, and
- already read by the last training (id <= the registry's highest experience
  cursor: an incremental retrain reads only rows after it, which stay as sent)

into one row per (job, model version, collective, size bucket, communicator,
algorithm, protocol, channels, chunk, origin, `bucket_s` received: a day by
default), across the job's pods and table versions (the rolled row keeps the
newest table version; no consumer of old rows reads it, the canary judge's
model version is kept). What training reads of them is kept exactly
(policy/train/store_data.py folds per (point, configuration) the calls and the
call-weighted log speedup over NCCL's choice): `count` is the sum, `mean_time_us`
the call-weighted mean (so calls x mean time, the TuningRun's totals, is kept),
and `nccl_default_time_us` is set so that count x log(default / mean) is the
sum of the rows'. p50, p99 and bus bandwidth become call-weighted means (an
approximation; training does not read them). The rolled row takes the smallest
id of its group, so it stays on the same side of every training cursor, and
rolling up rolled rows again keeps all of this (the fold is associative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl.operator.store.backend import Backend
from dynamiccl.operator.store.migrations import Dialect

HOUR_S: Final = 3600.0
DAY_S: Final = 86_400.0
PAGE: Final = 50_000
DELETE_CHUNK: Final = 1000  # ids per DELETE (bound parameters stay few)

_COLS: Final = (
    "id, idempotency_key, namespace, job_kind, job_name, job_uid, pod_uid, model_version, "
    "table_version, received_unix_s, collective, size_bucket, nbytes_min, nbytes_max, nranks, "
    "nnodes, algo, proto, nchannels, chunk_bytes, origin, count, mean_time_us, p50_time_us, "
    "p99_time_us, busbw_gbps, nccl_default_time_us"
)
# columns of _COLS that make a group (with the bucket of received_unix_s): not the id, key,
# pod, table version, time, byte range or the values
_KEY: Final = (2, 3, 4, 5, 7, 10, 11, 14, 15, 16, 17, 18, 19, 20)


@dataclass(frozen=True)
class RollupResult:
    """Rows read, and rows they became."""

    rows_before: int
    rows_after: int


def _fold(rows: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """One row of the group (see the module docstring)."""
    first = min(rows, key=lambda r: r[0])
    calls = sum(int(r[21]) for r in rows)
    w = [max(int(r[21]), 0) for r in rows]
    tot = sum(w) or 1

    def wmean(i: int) -> float:
        return sum(wi * float(r[i]) for wi, r in zip(w, rows, strict=True)) / tot

    mean = wmean(22)
    log_gain = sum(
        wi * math.log(float(r[26]) / float(r[22])) for wi, r in zip(w, rows, strict=True)
    )
    default = mean * math.exp(log_gain / tot)
    pods = {r[6] for r in rows}
    return (
        first[0],
        first[1],
        *first[2:6],
        first[6] if len(pods) == 1 else "",
        first[7],
        max(int(r[8]) for r in rows),
        max(float(r[9]) for r in rows),
        *first[10:12],
        min(int(r[12]) for r in rows),
        max(int(r[13]) for r in rows),
        *first[14:21],
        calls,
        mean,
        wmean(23),
        wmean(24),
        wmean(25),
        default,
    )


def _rollable(row: tuple[Any, ...]) -> bool:
    """Rows the fold keeps exactly: positive times and calls (others are left as they are)."""
    return int(row[21]) > 0 and float(row[22]) > 0 and float(row[26]) > 0


def rollup(
    backend: Backend, *, before_unix_s: float, max_id: int, bucket_s: float = DAY_S
) -> RollupResult:
    """Fold rows received before `before_unix_s` with id <= `max_id` (one transaction per
    page of `PAGE` rows; a group never spans two pages)."""
    insert = (
        f"INSERT INTO experience ({_COLS}) "
        + ("OVERRIDING SYSTEM VALUE " if backend.dialect == Dialect.POSTGRES else "")
        + f"VALUES ({', '.join(['?'] * 27)})"
    )
    before = after = 0
    last = 0
    while True:
        with backend.transaction() as cur:
            cur.execute(
                f"SELECT {_COLS} FROM experience WHERE id > ? AND id <= ? "
                "AND received_unix_s < ? ORDER BY id LIMIT ?",
                (last, max_id, before_unix_s, PAGE),
            )
            rows = cur.fetchall()
            if not rows:
                return RollupResult(before, after)
            last = int(rows[-1][0])
            groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
            for r in rows:
                if _rollable(r):
                    key = (*(r[i] for i in _KEY), math.floor(float(r[9]) / bucket_s))
                    groups.setdefault(key, []).append(r)
            for g in groups.values():
                if len(g) < 2:
                    continue
                ids = [int(r[0]) for r in g]
                for i in range(0, len(ids), DELETE_CHUNK):
                    chunk = ids[i : i + DELETE_CHUNK]
                    cur.execute(
                        f"DELETE FROM experience WHERE id IN ({', '.join(['?'] * len(chunk))})",
                        chunk,
                    )
                cur.execute(insert, _fold(g))
                before += len(g)
                after += 1

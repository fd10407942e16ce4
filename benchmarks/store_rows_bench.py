#!/usr/bin/env python3
"""Bytes per stored reward record, PostgreSQL and SQLite (the store sizing in docs/admin-guide.md).

    .venv/bin/python benchmarks/store_rows_bench.py [--batches 2000] [--records 20]

Stores `--batches` batches of `--records` records (the ingest benchmark's batch) through
the product's store (`ExperienceStore.insert_batches`, groups of 50), then reports
PostgreSQL's `pg_total_relation_size` (table + indexes) of `experience` per row and of
`batches` per batch, and the SQLite file (WAL checkpointed) per row.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.testing.postgres import PgServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_bench import _batch


def _fill(url: str, batches: int, records: int) -> ExperienceStore:
    s = open_store(url)
    for k in range(0, batches, 50):
        group = range(k, min(k + 50, batches))
        s.insert_batches([RewardBatch.model_validate_json(_batch(i, 0, records)) for i in group])
    return s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--records", type=int, default=20)
    a = p.parse_args()
    out = []
    with PgServer(fsync=False) as pg:
        s = _fill(pg.url, a.batches, a.records)
        with s.backend.transaction(write=False) as cur:
            cur.execute(
                "SELECT pg_total_relation_size('experience'), pg_total_relation_size('batches')"
            )
            row = cur.fetchone()
        assert row is not None
        n = s.count_experience()
        s.close()
        per_row, per_batch = row[0] / n, row[1] / a.batches
        out.append(
            {
                "store": "postgres",
                "rows": n,
                "experience_bytes_per_row": round(per_row),
                "batches_bytes_per_batch": round(per_batch),
                "bytes_per_record": round(per_row + per_batch / a.records),
            }
        )
    with tempfile.TemporaryDirectory() as d:
        s = _fill(f"sqlite:///{d}/x.db", a.batches, a.records)
        n = s.count_experience()
        s.close()
        with sqlite3.connect(f"{d}/x.db") as db:  # fold the WAL into the file
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = sum(f.stat().st_size for f in Path(d).iterdir())
        out.append({"store": "sqlite", "rows": n, "bytes_per_record": round(size / n)})
    for o in out:
        print(json.dumps(o))
    return 0


if __name__ == "__main__":
    sys.exit(main())

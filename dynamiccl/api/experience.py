"""Reading the experience store — shared by the operator (which owns and writes it) and
training (`dynamiccl train --from-store URL`, which only reads).

Store URLs: a file path or `sqlite:///PATH` (SQLAlchemy's spelling:
`sqlite:////abs/path` is absolute) → SQLite; `postgresql://...` (or
`postgres://`) → PostgreSQL. `read_experience` streams `ExperienceRow`s in id
order, resuming after a cursor (the `experience_cursor` of the model a run
fine-tunes), without ever writing: SQLite is opened read-only (it must be on a
volume this process can reach; WAL readers need the directory writable for
the `-shm` file), PostgreSQL in a read-only transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from dynamiccl.api.rewards import ExperienceRow, RewardRecord
from dynamiccl.api.store_secrets import redact_message, redact_store_url

DEFAULT_PAGE: Final = 10_000

# Columns of the `experience` table a reader needs, in the order `row_to_experience` reads.
SELECT_EXPERIENCE: Final = (
    "SELECT id, namespace, job_kind, job_name, job_uid, pod_uid, model_version, table_version, "
    "received_unix_s, collective, size_bucket, nbytes_min, nbytes_max, nranks, nnodes, algo, "
    "proto, nchannels, chunk_bytes, origin, count, mean_time_us, p50_time_us, p99_time_us, "
    "busbw_gbps, nccl_default_time_us FROM experience"
)
RECORD_FIELDS: Final = (
    "collective",
    "size_bucket",
    "nbytes_min",
    "nbytes_max",
    "nranks",
    "nnodes",
    "algo",
    "proto",
    "nchannels",
    "chunk_bytes",
    "origin",
    "count",
    "mean_time_us",
    "p50_time_us",
    "p99_time_us",
    "busbw_GBps",
    "nccl_default_time_us",
)


class StoreKind(StrEnum):
    """Backends of the experience store."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


class StoreURLError(ValueError):
    """A store URL names no supported backend; the message shows the accepted forms."""


def parse_store_url(url: str) -> tuple[StoreKind, str]:
    """(backend, target): the SQLite file path, or the PostgreSQL URL itself."""
    if url.startswith(("postgresql://", "postgres://")):
        return StoreKind.POSTGRES, url
    if url.startswith("sqlite:///"):
        return StoreKind.SQLITE, url.removeprefix("sqlite:///")
    if "://" in url:
        raise StoreURLError(
            f"store URL {redact_store_url(url)!r}: expected a file path, sqlite:///PATH "
            "or postgresql://..."
        )
    if not url:
        raise StoreURLError("store URL is empty")
    return StoreKind.SQLITE, url


def row_to_experience(row: tuple[Any, ...]) -> ExperienceRow:
    """One `SELECT_EXPERIENCE` row as a validated ExperienceRow."""
    rec = RewardRecord.model_validate(dict(zip(RECORD_FIELDS, row[9:], strict=True)))
    return ExperienceRow(
        id=int(row[0]),
        namespace=str(row[1]),
        job_kind=str(row[2]),
        job_name=str(row[3]),
        job_uid=str(row[4]),
        pod_uid=str(row[5]),
        model_version=str(row[6]),
        table_version=int(row[7]),
        received_unix_s=float(row[8]),
        record=rec,
    )


def _pages(url: str, sql: str, after_id: int, page: int) -> Iterator[list[tuple[Any, ...]]]:
    """Pages of `sql` (`... WHERE <table>.id > ? ORDER BY ... LIMIT ?`), read-only, id order.

    The first column of every row is the id the next page resumes after.
    """
    kind, target = parse_store_url(url)
    if kind is StoreKind.SQLITE:
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"experience store {path} does not exist")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            while True:
                rows = conn.execute(sql, (after_id, page)).fetchall()
                yield rows
                if len(rows) < page:
                    return
                after_id = int(rows[-1][0])
        finally:
            conn.close()
    import psycopg  # noqa: PLC0415 - only PostgreSQL users need it

    try:
        pg = psycopg.connect(target, autocommit=True)
    except psycopg.Error as exc:  # libpq may echo the conninfo (password included)
        raise type(exc)(redact_message(str(exc), target)) from None
    with pg:
        pg.read_only = True
        while True:
            with pg.transaction():
                rows = [tuple(r) for r in pg.execute(sql.replace("?", "%s"), (after_id, page))]
            yield rows
            if len(rows) < page:
                return
            after_id = int(rows[-1][0])


def read_experience(
    url: str, *, after_id: int = 0, page: int = DEFAULT_PAGE
) -> Iterator[ExperienceRow]:
    """Every experience row with id > `after_id`, oldest first (read-only, paged)."""
    sql = f"{SELECT_EXPERIENCE} WHERE id > ? ORDER BY id LIMIT ?"
    for rows in _pages(url, sql, after_id, page):
        yield from (row_to_experience(r) for r in rows)


# A training row: id, job uid, the RECORD_FIELDS, whether the job's step times refused
# this configuration in this cell (the learning loop's `step_refusals`: it made the
# collectives faster and the step slower), then the job's stored features (schema
# version and JSON; both NULL when the job has none).
SELECT_TRAINING: Final = (
    "SELECT e.id, e.job_uid, e.collective, e.size_bucket, e.nbytes_min, e.nbytes_max, e.nranks, "
    "e.nnodes, e.algo, e.proto, e.nchannels, e.chunk_bytes, e.origin, e.count, e.mean_time_us, "
    "e.p50_time_us, e.p99_time_us, e.busbw_gbps, e.nccl_default_time_us, "
    "EXISTS (SELECT 1 FROM step_refusals r WHERE r.job_uid = e.job_uid "
    "AND r.collective = e.collective AND r.size_bucket = e.size_bucket AND r.nranks = e.nranks "
    "AND r.nnodes = e.nnodes AND r.algo = e.algo AND r.proto = e.proto "
    "AND r.nchannels = e.nchannels AND r.chunk_bytes = e.chunk_bytes), f.schema_version, "
    "f.features_json FROM experience e LEFT JOIN job_features f ON f.job_uid = e.job_uid "
    "WHERE e.id > ? ORDER BY e.id LIMIT ?"
)
TRAINING_RECORD_SLICE: Final = slice(2, 2 + len(RECORD_FIELDS))
TRAINING_STEP_REFUSED: Final = 2 + len(RECORD_FIELDS)  # the column of the refusal flag


def read_training_rows(
    url: str, *, after_id: int = 0, page: int = DEFAULT_PAGE
) -> Iterator[list[tuple[Any, ...]]]:
    """Pages of raw training rows (`SELECT_TRAINING`), unvalidated: the trainer counts bad ones.

    A store older than schema version 6 (no `step_refusals`) cannot be read this way;
    the ingest migrates its store at start, so a store it wrote always can.
    """
    yield from _pages(url, SELECT_TRAINING, after_id, page)


def record_of(row: tuple[Any, ...]) -> RewardRecord:
    """The validated RewardRecord of a `SELECT_TRAINING` row (pydantic ValidationError if bad)."""
    return RewardRecord.model_validate(
        dict(zip(RECORD_FIELDS, row[TRAINING_RECORD_SLICE], strict=True))
    )

"""PostgreSQL backend of the experience store (psycopg 3), for HA deployments.

Commits are durable with PostgreSQL's default `synchronous_commit = on`. The
backend keeps one connection (reconnected when broken) and serialises its use;
several operator processes may share one database (idempotency keys are a
primary key, so concurrent retries still store a batch once).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Final

import psycopg

from dynamiccl.api.store_secrets import redact_message, redact_store_url
from dynamiccl.operator.store.migrations import Dialect

CONNECT_TIMEOUT_S: Final = 10


@lru_cache(maxsize=256)
def _to_pyformat(sql: str) -> str:
    """`?` placeholders → psycopg's `%s` (literal `%` escaped first)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Cursor:
    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[object] = ()) -> object:
        return self._cur.execute(_to_pyformat(sql), tuple(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._cur.executemany(_to_pyformat(sql), [tuple(r) for r in rows])

    def fetchone(self) -> tuple[Any, ...] | None:
        row = self._cur.fetchone()
        return None if row is None else tuple(row)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._cur.fetchall()]

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)


def redact(url: str) -> str:
    """The URL without its password, for logs."""
    return redact_store_url(url)


class PostgresBackend:
    """One connection, serialised by a lock, reconnected when broken."""

    dialect: Final = Dialect.POSTGRES

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        with self._lock:
            self._connection()  # fail fast on a bad URL

    @property
    def display_url(self) -> str:
        return redact(self._url)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            try:
                self._conn = psycopg.connect(
                    self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                )
            except psycopg.Error as exc:  # libpq may echo the conninfo (password included)
                raise type(exc)(redact_message(str(exc), self._url)) from None
        return self._conn

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[_Cursor]:
        """One transaction: commit on normal exit, rollback on any exception."""
        del write  # PostgreSQL needs no up-front write lock
        with self._lock:
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cur:
                yield _Cursor(cur)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()

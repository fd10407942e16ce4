"""SQLite backend of the experience store: WAL, synchronous=FULL, one writer.

`synchronous=FULL` in WAL mode syncs the WAL on every commit, so a commit that
returned survives a process kill or power loss (the ingest endpoint answers 2xx
only after the commit). Writers serialise on a process-local lock and, across
processes, on `BEGIN IMMEDIATE` with a busy timeout.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from dynamiccl.operator.store.migrations import Dialect

BUSY_TIMEOUT_S: Final = 30.0


class _Cursor:
    """sqlite3 cursor with the store's cursor interface (`?` placeholders natively)."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[object] = ()) -> object:
        return self._cur.execute(sql, tuple(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._cur.executemany(sql, [tuple(r) for r in rows])

    def fetchone(self) -> tuple[Any, ...] | None:
        row = self._cur.fetchone()
        return None if row is None else tuple(row)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._cur.fetchall()]

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount


class SqliteBackend:
    """One connection, serialised by a lock; explicit transactions."""

    dialect: Final = Dialect.SQLITE

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
        mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise RuntimeError(f"{path}: cannot switch SQLite to WAL mode (got {mode})")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")

    @property
    def display_url(self) -> str:
        """Where the data lives, for logs (no secrets in a path)."""
        return f"sqlite:///{self.path}"

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[_Cursor]:
        """One transaction: commit on normal exit, rollback on any exception."""
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield _Cursor(cur)
            except BaseException:
                self._conn.rollback()
                raise
            else:
                cur.execute("COMMIT")
            finally:
                cur.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

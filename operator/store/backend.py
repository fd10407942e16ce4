"""How the experience store reaches its database: the backend interface and URL parsing.

Store URLs (parsed by dynamiccl.api.experience.parse_store_url): a file path or
`sqlite:///PATH` (SQLAlchemy's spelling: `sqlite:////abs/path` is absolute) → SQLite;
`postgresql://user:pass@host:port/db` → PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from dynamiccl.api.experience import StoreKind, StoreURLError, parse_store_url
from dynamiccl.operator.store.migrations import Dialect
from dynamiccl.operator.store.postgres import PostgresBackend
from dynamiccl.operator.store.sqlite import SqliteBackend


class StoreCursor(Protocol):
    """What the store needs of a cursor (placeholders are `?` in every dialect)."""

    def execute(self, sql: str, params: Sequence[object] = ()) -> object: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None: ...

    def fetchone(self) -> tuple[Any, ...] | None: ...

    def fetchall(self) -> list[tuple[Any, ...]]: ...

    @property
    def rowcount(self) -> int: ...


class Backend(Protocol):
    """A database connection the store runs its transactions on."""

    @property
    def dialect(self) -> Dialect: ...

    @property
    def display_url(self) -> str: ...

    def transaction(self, *, write: bool = True) -> AbstractContextManager[StoreCursor]: ...

    def close(self) -> None: ...


def open_backend(url: str) -> Backend:
    """The backend for a store URL: a path / `sqlite:///path`, or `postgresql://...`."""
    kind, target = parse_store_url(url)
    if kind is StoreKind.POSTGRES:
        return PostgresBackend(target)
    return SqliteBackend(Path(target))


__all__ = ["Backend", "StoreCursor", "StoreURLError", "open_backend"]

"""Schema migrations: in order, each once, resumable, append-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.operator.store.migrations import (
    LATEST_VERSION,
    MIGRATIONS,
    Dialect,
    Migration,
    apply_migrations,
    current_version,
)
from dynamiccl.operator.store.sqlite import SqliteBackend


def tables(b: SqliteBackend) -> set[str]:
    with b.transaction(write=False) as cur:
        cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {str(r[0]) for r in cur.fetchall()}


def test_versions_are_consecutive_and_render_in_both_dialects() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, LATEST_VERSION + 1))
    for m in MIGRATIONS:
        for d in Dialect:
            for stmt in m.render(d):
                assert "{" not in stmt


def test_stepwise_upgrade(tmp_path: Path) -> None:
    b = SqliteBackend(tmp_path / "s.db")
    try:
        assert apply_migrations(b.transaction, Dialect.SQLITE, target=1) == [1]
        assert "models" not in tables(b)
        assert apply_migrations(b.transaction, Dialect.SQLITE, target=1) == []
        assert apply_migrations(b.transaction, Dialect.SQLITE) == list(range(2, LATEST_VERSION + 1))
        assert {"batches", "experience", "models", "events", "schema_version"} <= tables(b)
        with b.transaction(write=False) as cur:
            assert current_version(cur) == LATEST_VERSION
        with pytest.raises(ValueError, match="target"):
            apply_migrations(b.transaction, Dialect.SQLITE, target=LATEST_VERSION + 1)
    finally:
        b.close()


def test_a_failing_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    b = SqliteBackend(tmp_path / "f.db")
    broken = (
        *MIGRATIONS[:1],
        Migration(2, "half-broken", ("CREATE TABLE t2 (x INTEGER)", "NOT SQL AT ALL")),
    )
    try:
        with pytest.raises(Exception, match="syntax"):
            apply_migrations(b.transaction, Dialect.SQLITE, migrations=broken, target=2)
        with b.transaction(write=False) as cur:
            assert current_version(cur) == 1
        assert "t2" not in tables(b)  # the failed step was rolled back as a whole
        assert apply_migrations(b.transaction, Dialect.SQLITE) == list(range(2, LATEST_VERSION + 1))
    finally:
        b.close()

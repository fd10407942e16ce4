"""Store URLs pick the right backend; bad URLs fail with one clear message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dynamiccl.operator.store.backend import StoreURLError, open_backend
from dynamiccl.operator.store.migrations import Dialect
from dynamiccl.operator.store.postgres import redact
from dynamiccl.operator.store.sqlite import SqliteBackend


def test_absolute_sqlite_url_and_plain_path(tmp_path: Path) -> None:
    b = open_backend(f"sqlite:///{tmp_path}/a/x.db")  # sqlite:////abs/path
    try:
        assert isinstance(b, SqliteBackend)
        assert b.dialect is Dialect.SQLITE
        assert b.path == tmp_path / "a" / "x.db"
        assert b.path.exists()
    finally:
        b.close()
    b = open_backend(str(tmp_path / "y.db"))
    try:
        assert isinstance(b, SqliteBackend)
        assert b.path == tmp_path / "y.db"
    finally:
        b.close()


def test_relative_sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    b = open_backend("sqlite:///rel.db")
    try:
        assert isinstance(b, SqliteBackend)
        assert (tmp_path / "rel.db").exists()
        assert os.path.samefile(b.path, tmp_path / "rel.db")
    finally:
        b.close()


def test_sqlite_is_wal_with_full_sync(tmp_path: Path) -> None:
    b = open_backend(str(tmp_path / "z.db"))
    try:
        with b.transaction(write=False) as cur:
            cur.execute("PRAGMA journal_mode")
            assert cur.fetchone() == ("wal",)
            cur.execute("PRAGMA synchronous")
            assert cur.fetchone() == (2,)  # FULL
    finally:
        b.close()


@pytest.mark.parametrize("url", ["", "mysql://x/y", "http://store"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(StoreURLError, match="store URL"):
        open_backend(url)


def test_redact_hides_password() -> None:
    assert redact("postgresql://u:s3cret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://h/db") == "postgresql://h/db"

"""SQLite backend: WAL + synchronous=FULL, explicit transactions, durable on kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.sqlite import SqliteBackend


def test_wal_full_sync(tmp_path: Path) -> None:
    b = SqliteBackend(tmp_path / "a" / "s.db")  # parent directories are created
    try:
        with b.transaction(write=False) as cur:
            cur.execute("PRAGMA journal_mode")
            assert cur.fetchone() == ("wal",)
            cur.execute("PRAGMA synchronous")
            assert cur.fetchone() == (2,)  # FULL
        assert b.display_url == f"sqlite:///{tmp_path / 'a' / 's.db'}"
    finally:
        b.close()


def test_exception_rolls_back(tmp_path: Path) -> None:
    b = SqliteBackend(tmp_path / "s.db")
    try:
        with b.transaction() as cur:
            cur.execute("CREATE TABLE t (x INTEGER)")

        def insert_then_fail() -> None:
            with b.transaction() as cur:
                cur.execute("INSERT INTO t VALUES (1)")
                raise RuntimeError("abort")

        with pytest.raises(RuntimeError):
            insert_then_fail()
        with b.transaction(write=False) as cur:
            cur.execute("SELECT COUNT(*) FROM t")
            assert cur.fetchone() == (0,)
    finally:
        b.close()


def test_a_returned_commit_survives_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    open_store(str(db)).close()
    code = textwrap.dedent(
        f"""
        import os, sys
        from dynamiccl.operator.store.sqlite import SqliteBackend
        b = SqliteBackend(__import__("pathlib").Path({str(db)!r}))
        with b.transaction() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS marks (n INTEGER)")
        for n in range(1_000_000):
            with b.transaction() as cur:
                cur.execute("INSERT INTO marks VALUES (?)", (n,))
            print(n, flush=True)  # only after the commit returned
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    last = -1
    for line in proc.stdout:
        last = int(line)
        if last >= 200:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    b = SqliteBackend(db)
    try:
        with b.transaction(write=False) as cur:
            cur.execute("SELECT COUNT(*), MAX(n) FROM marks")
            count, top = cur.fetchone()  # type: ignore[misc]
    finally:
        b.close()
    assert top >= last  # every acknowledged commit is there
    assert count == top + 1  # and nothing half-written

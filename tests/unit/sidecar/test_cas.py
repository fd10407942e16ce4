"""The file CAS backend: version check, atomic swap, many writers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dynamiccl.api.epoch import EpochRecord
from dynamiccl.sidecar.cas import FileCAS, load_record, update_record


def test_read_empty_then_cas_by_version(tmp_path: Path) -> None:
    s = FileCAS(tmp_path / "rec.json")
    assert s.read() == (None, 0)
    assert s.cas(0, "one")
    assert s.read() == ("one", 1)
    assert not s.cas(0, "stale")
    assert s.cas(1, "two")
    assert s.read() == ("two", 2)


# Each writer is a fresh interpreter, never a fork of the test process: a fork of a process
# with threads (earlier tests leave some) can deadlock in the child, and multiprocessing then
# joins the hung child at interpreter exit, hanging the whole test run (seen in a CI run).
_WRITER = """
import sys
from pathlib import Path
from dynamiccl.sidecar.cas import FileCAS, update_record
from dynamiccl.api.epoch import report
path, voter, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
store = FileCAS(path)
for i in range(n):
    update_record(store, lambda r, i=i: report(r, voter, i + 1), attempts=10_000)
"""


def test_concurrent_updates_are_never_lost(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store = FileCAS(path)
    store.cas(0, EpochRecord(interval=64, voters=("a", "b", "c")).model_dump_json())
    writers = {
        v: subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), v, "40"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for v in ("a", "b", "c")
    }
    errors = {}
    try:
        for v, p in writers.items():
            _, err = p.communicate(timeout=120)
            if p.returncode:
                errors[v] = f"exit {p.returncode}: {err[-2000:]}"
    finally:
        for p in writers.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert errors == {}
    rec, version = load_record(store)
    assert rec is not None
    assert rec.reported == {"a": 40, "b": 40, "c": 40}
    assert version == 1 + 3 * 40  # every update was one successful swap


def test_update_record_without_record(tmp_path: Path) -> None:
    assert update_record(FileCAS(tmp_path / "none.json"), lambda r: r) is None

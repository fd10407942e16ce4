"""The file CAS backend: version check, atomic swap, many writers."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from dynamiccl.agent.cas import FileCAS, load_record, update_record
from dynamiccl.api.epoch import EpochRecord, report


def test_read_empty_then_cas_by_version(tmp_path: Path) -> None:
    s = FileCAS(tmp_path / "rec.json")
    assert s.read() == (None, 0)
    assert s.cas(0, "one")
    assert s.read() == ("one", 1)
    assert not s.cas(0, "stale")
    assert s.cas(1, "two")
    assert s.read() == ("two", 2)


def _bump(path: str, voter: str, n: int) -> None:
    store = FileCAS(Path(path))
    for i in range(n):

        def change(r: EpochRecord, i: int = i) -> EpochRecord:
            return report(r, voter, i + 1)

        update_record(store, change, attempts=10_000)


def test_concurrent_updates_are_never_lost(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store = FileCAS(path)
    store.cas(0, EpochRecord(interval=64, voters=("a", "b", "c")).model_dump_json())
    procs = [mp.Process(target=_bump, args=(str(path), v, 40)) for v in ("a", "b", "c")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    rec, version = load_record(store)
    assert rec is not None
    assert rec.reported == {"a": 40, "b": 40, "c": 40}
    assert version == 1 + 3 * 40  # every update was one successful swap


def test_update_record_without_record(tmp_path: Path) -> None:
    assert update_record(FileCAS(tmp_path / "none.json"), lambda r: r) is None

"""The coordinator: tables by version, proposals through the CAS record, closing votes."""

from __future__ import annotations

from pathlib import Path

from dynamiccl.api.epoch import EpochStatus, vote
from dynamiccl.api.table import DecisionTable
from dynamiccl.sidecar.cas import FileCAS, load_record, update_record
from dynamiccl.sidecar.proposer import Coordinator, DirTableStore, init_record


def test_table_store_round_trip(tmp_path: Path) -> None:
    store = DirTableStore(tmp_path / "t")
    t = DecisionTable(version=7, scales=(1,))
    store.put(t)
    assert store.get(7) == t
    assert store.get(8) is None


def test_init_record_is_idempotent(tmp_path: Path) -> None:
    cas = FileCAS(tmp_path / "r.json")
    a = init_record(cas, 256, ("x",))
    b = init_record(cas, 1024, ("y",))
    assert a == b
    assert cas.read()[1] == 1


def test_publish_one_epoch_at_a_time_and_commit_on_unanimity(tmp_path: Path) -> None:
    cas = FileCAS(tmp_path / "r.json")
    init_record(cas, 256, ("x", "y"))
    coord = Coordinator(cas, DirTableStore(tmp_path / "t"), lead=2)
    t1, t2 = DecisionTable(version=1, scales=(1,)), DecisionTable(version=2, scales=(2,))
    assert coord.publish(t1) == 1
    assert coord.publish(t2) is None  # epoch 1 still pending
    update_record(cas, lambda r: vote(r, "x", 1, True))
    rec = coord.step()
    assert rec is not None
    assert rec.epochs[0].status == EpochStatus.PENDING
    update_record(cas, lambda r: vote(r, "y", 1, True))
    rec = coord.step()
    assert rec is not None
    assert rec.epochs[0].status == EpochStatus.COMMITTED
    assert coord.publish(t2) == 2
    rec2, _ = load_record(cas)
    assert rec2 is not None
    assert rec2.epochs[1].table_digest == t2.digest
    assert rec2.epochs[1].boundary > rec2.epochs[0].boundary

"""Bulk ring reading against files written by the real plugin (.so) and by hand."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiccl.sidecar import shm
from dynamiccl.sidecar.ring import RingReader
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, default_so, play

PROC0 = shm.PROCS_OFF
RECORD = struct.Struct("<QQQQQQQBBBBI")


def _plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Plugin]:
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    so = tmp_path / "copy.so"  # a private copy: the plugin's process state starts fresh
    so.write_bytes(default_so().read_bytes())
    return path, Plugin(so)


def test_records_of_the_real_plugin_are_read_without_being_consumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, plugin = _plugin(tmp_path, monkeypatch)
    comm = Comm(plugin, 5, 16, 2, comm_id=0xABC)
    prof = ProfiledComm(plugin, 5, 16, 2, comm_id=0xABC)
    calls = [(4, 1 << 20)] * 50 + [(2, 4096)] * 30

    played = play(comm, calls, lambda c, n, a, p, k: 3.0 + n / 1e5, profiler=prof)
    with shm.ShmFile(path) as f:
        assert f.comms() == {0xABC: (16, 2)}  # registered before the first record
    reader = RingReader(path)
    try:
        (slot,) = reader.used_slots()
        b = reader.read(slot, 0)
        assert (b.start, b.end, b.skipped) == (0, 80, 0)
        assert [r.exec_ns for r in b.records] == [p.exec_ns for p in played]
        assert [(r.coll, r.nbytes) for r in b.records] == calls
        assert [r.coll_seq for r in b.records] == list(range(80))
        assert {r.comm_id for r in b.records} == {0xABC}
        assert reader.tail(slot) == 0  # reading is not consuming
        assert reader.scan() == ([slot], [80], [0])
        assert len(reader.read(slot, 0).records) == 80
        part = reader.read(slot, 70, limit=5)
        assert [r.coll_seq for r in part.records] == [70, 71, 72, 73, 74]
        reader.consume(slot, 80)
        reader.consume(slot, 10)  # never backwards
        assert reader.tail(slot) == 80
        assert reader.read(slot, 80).records == []
    finally:
        reader.close()


def test_registry_keeps_one_entry_per_communicator_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, plugin = _plugin(tmp_path, monkeypatch)
    for cid, shape in ((1, (8, 1)), (2, (64, 8)), (1, (8, 1))):
        comm = Comm(plugin, 6, *shape, comm_id=cid)
        prof = ProfiledComm(plugin, 5, *shape, comm_id=cid)
        play(comm, [(4, 1024)] * 3, lambda *a: 1.0, profiler=prof)
    with shm.ShmFile(path) as f:
        assert f.comms() == {1: (8, 1), 2: (64, 8)}


def _write(path: Path, pos: int, *, seq: int | None = None, comm: int = 5) -> None:
    """A record at ring position `pos` of slot 0, as a writer would leave it."""
    off = PROC0 + shm.PROC_HDR_SIZE + (pos % shm.RING_CAP) * shm.RECORD_SIZE
    body = RECORD.pack(
        pos + 1 if seq is None else seq, comm, 64, 1, 2, 1000 + pos, pos, 4, 1, 2, 4, 4
    )
    with path.open("r+b") as f:
        f.seek(off)
        f.write(body)


def _set_head(path: Path, head: int, owner: int = 1) -> None:
    with path.open("r+b") as f:
        f.seek(PROC0)
        f.write(struct.pack("<Q", owner))
        f.seek(PROC0 + 64)
        f.write(struct.pack("<Q", head))


def test_an_unpublished_record_stops_reading_then_is_skipped_after_the_timeout(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    for pos in (0, 1, 3, 4):
        _write(path, pos)
    _write(path, 2, seq=0)  # claimed, never published (its writer died)
    _set_head(path, 5)
    now = [100.0]
    reader = RingReader(path, stuck_after_s=1.0, clock=lambda: now[0])
    try:
        b = reader.read(0, 0)
        assert ([r.coll_seq for r in b.records], b.end, b.skipped) == ([0, 1], 2, 0)
        now[0] += 0.5
        assert reader.read(0, 2).end == 2  # still waiting for the writer
        now[0] += 0.6
        b = reader.read(0, 2)
        assert (b.records, b.end, b.skipped) == ([], 3, 1)
        assert [r.coll_seq for r in reader.read(0, 3).records] == [3, 4]
    finally:
        reader.close()


def test_stale_records_of_an_earlier_lap_are_not_read(tmp_path: Path) -> None:
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    _write(path, 3)  # lap 0's record at index 3
    _set_head(path, shm.RING_CAP + 4)
    reader = RingReader(path)
    try:  # position RING_CAP + 3 maps to index 3 but carries lap 0's seq
        b = reader.read(0, shm.RING_CAP + 3)
        assert (b.records, b.end) == ([], shm.RING_CAP + 3)
    finally:
        reader.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=64), st.integers(0, 3000))
def test_read_returns_exactly_the_published_prefix(published: list[bool], start: int) -> None:
    import tempfile  # noqa: PLC0415 - hypothesis and function-scoped fixtures do not mix

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.shm"
        shm.create(path, 64)
        for i, ok in enumerate(published):
            _write(path, start + i, seq=None if ok else 0)
        _set_head(path, start + len(published))
        reader = RingReader(path, stuck_after_s=1e9)
        try:
            b = reader.read(0, start)
            prefix = published.index(False) if False in published else len(published)
            assert [r.coll_seq for r in b.records] == list(range(start, start + prefix))
            assert b.end == start + prefix
        finally:
            reader.close()


def test_a_short_or_foreign_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.shm"
    bad.write_bytes(b"x" * 100)
    with pytest.raises(shm.ShmError):
        RingReader(bad)
    with pytest.raises(shm.ShmError):
        RingReader(tmp_path / "absent.shm")


def test_the_users_tag_of_a_v7_call_reaches_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, plugin = _plugin(tmp_path, monkeypatch)
    prof = ProfiledComm(plugin, 7, 8, 1, comm_id=3)
    for tag in (0, 0xDEADBEEF, 7):
        prof.collective(4, 1024, b"ncclFloat32", 1, 2, 2, 4.0, user_tag=tag)
    reader = RingReader(path)
    try:
        b = reader.read(0, 0)
        assert [r.user_tag for r in b.records] == [0, 0xDEADBEEF, 7]
        assert [r.exec_ns for r in b.records] == [4000] * 3
    finally:
        reader.close()

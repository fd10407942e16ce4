"""The Python codec of the shared-memory file, against itself and against the real plugin."""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiccl.sidecar import shm, shm_table
from dynamiccl.testing.nccl_player import Plugin, ProfiledComm, default_so
from tests.unit.sidecar.test_shm_table import TABLE


def test_create_keeps_a_valid_file_and_replaces_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "f.shm"
    shm.create(path, 128)
    with shm.ShmFile(path) as f:
        f.set_entry(1, shm.EPOCH_COMMITTED, 256)
    shm.create(path, 128)  # a restarted sidecar: state survives
    with shm.ShmFile(path) as f:
        assert f.interval == 128
        assert f.entry(1) == (shm.EPOCH_COMMITTED, 256)
    shm.create(path, 256)  # different L: a new file
    with shm.ShmFile(path) as f:
        assert f.interval == 256
        assert f.entry(1) == (shm.EPOCH_NONE, 0)


def test_a_missing_or_short_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(shm.ShmError, match="No such file"):
        shm.ShmFile(tmp_path / "absent")
    (tmp_path / "small").write_bytes(b"x")
    with pytest.raises(shm.ShmError, match="smaller"):
        shm.ShmFile(tmp_path / "small")


def test_table_slots_are_write_once(tmp_path: Path) -> None:
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    with shm.ShmFile(path) as f:
        f.write_table(3, shm_table.encode_table(TABLE, 3))
        f.write_table(3, shm_table.encode_table(TABLE, 3))  # same content: no-op
        other = TABLE.model_copy(update={"version": 9})
        with pytest.raises(shm.TableSlotError):
            f.write_table(3, shm_table.encode_table(other, 3))
        assert shm_table.validate_table(f.read_table(3), 3) == 0
        with pytest.raises(ValueError, match="multiple of L"):
            f.set_entry(1, shm.EPOCH_PENDING, 100)


def test_a_reused_slot_keeps_its_table_until_the_new_epoch_is_written(tmp_path: Path) -> None:
    """Epoch 64 takes epoch 1's slot: the words change, the table bytes do not, and they can
    be written only while the words hold epoch 64 and do not say COMMITTED (a process copies a
    slot's table only under COMMITTED words of the epoch it wants)."""
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    with shm.ShmFile(path) as f:
        one = shm_table.encode_table(TABLE, 1)
        f.write_table(1, one)
        f.set_entry(1, shm.EPOCH_COMMITTED, 64)
        with pytest.raises(shm.TableSlotError):
            f.put_image(1, one)  # committed: a process may be copying it
        f.take_slot(64, shm.EPOCH_PENDING, 4096)
        assert f.slot(1) == (64, shm.EPOCH_PENDING, 4096)
        assert f.read_table(1) == one
        assert f.image_header(64)[:3] == (shm_table.TABLE_READY, 1, TABLE.version)
        f.take_slot(1, shm.EPOCH_COMMITTED, 64)  # the reuse aborted: epoch 1 is back
        assert f.slot(1) == (1, shm.EPOCH_COMMITTED, 64)
        assert shm_table.validate_table(f.read_table(1), 1) == 0
        f.take_slot(64, shm.EPOCH_PENDING, 4096)
        f.put_image(64, shm_table.encode_table(TABLE, 64))
        f.set_entry(64, shm.EPOCH_COMMITTED, 4096)
        assert shm_table.validate_table(f.read_table(64), 64) == 0
        assert f.entry(1) == (shm.EPOCH_NONE, 0)  # retired


def test_profiler_records_written_by_the_plugin_are_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    so = tmp_path / "copy.so"
    shutil.copy(default_so(), so)
    plugin = Plugin(so)
    comm = ProfiledComm(plugin, 6, nranks=8, nnodes=1, comm_id=0xABCDEF)
    expected = [
        comm.collective(4, 1000 * (i + 1), b"ncclBfloat16", 1, 2, 3, 10.0 + i) for i in range(5)
    ]
    gathered = comm.collective(2, 256, b"ncclFloat32", 6, 0, 2, 4.0)
    with shm.ShmFile(path) as f:
        (proc,) = f.procs()
        assert proc.pid > 0
        recs = f.drain(proc.index)
        assert [r.exec_ns for r in recs] == [*expected, gathered]
        assert [r.nbytes for r in recs] == [2000 * (i + 1) for i in range(5)] + [256 * 4 * 8]
        first = recs[0]
        assert (first.comm_id, first.coll, first.algo, first.proto, first.nchannels) == (
            0xABCDEF,
            4,
            1,
            2,
            3,
        )
        assert first.n_kernel_ch == 3
        assert first.stop_ns - first.start_ns >= first.exec_ns
        assert [r.seq for r in recs] == list(range(1, 7))
        assert f.drain(proc.index) == []
        head, tail, dropped = f.ring_counters(proc.index)
        assert (head, tail, dropped) == (6, 6, 0)
    comm.finalize()


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=0, max_size=4096), st.integers(0, 2000))
def test_draining_a_garbage_ring_never_raises(garbage: bytes, tail: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "g.shm"
        shm.create(path, 64)
        with shm.ShmFile(path) as f:
            off = shm.PROCS_OFF + shm.PROC_HDR_SIZE
            f._buf[off : off + len(garbage)] = garbage
            f._buf[shm.PROCS_OFF + 128 : shm.PROCS_OFF + 136] = struct.pack("<Q", tail)
            recs = f.drain(0)
            assert [r.seq for r in recs] == list(range(tail + 1, tail + 1 + len(recs)))

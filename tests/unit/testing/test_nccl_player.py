"""The harness itself: NCCL's pick, cost-table shapes, and every ABI version loads and runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, scale_class, size_bucket
from dynamiccl.sidecar import shm, shm_table
from dynamiccl.testing import nccl_player
from dynamiccl.testing.nccl_player import (
    IGNORE,
    PROFILER_VERSIONS,
    TUNER_VERSIONS,
    Comm,
    Plugin,
    ProfiledComm,
    default_so,
    element_count,
    nccl_pick,
    play,
    play_call,
    realistic_cost_table,
)


def test_nccl_pick_takes_the_smallest_available_entry() -> None:
    cost = [[IGNORE] * 3 for _ in range(7)]
    assert nccl_pick(cost) is None
    cost[1][2], cost[0][1], cost[4][2] = 5.0, 3.0, 0.0
    assert nccl_pick(cost) == (4, 2)


def test_realistic_cost_tables_have_nccls_shape() -> None:
    t = realistic_cost_table(4, 1 << 20, 16, 2, nvls=True, collnet=True)
    assert len(t) == 7
    assert all(len(r) == 3 for r in t)
    assert all(v > 0 for v in t[1])  # ring always
    assert t[4][0] == IGNORE  # NVLS has SIMPLE only
    assert t[4][2] > 0
    assert t[6] == [IGNORE] * 3  # PAT not for all-reduce
    ag = realistic_cost_table(2, 1 << 20, 16, 2, pat=True)
    assert ag[0] == [IGNORE] * 3  # no tree for all-gather
    assert ag[6][2] > 0
    small, big = realistic_cost_table(4, 1 << 10, 8, 1), realistic_cost_table(4, 1 << 30, 8, 1)
    assert big[1][2] > small[1][2]


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Plugin:
    monkeypatch.delenv("DYNAMICCL_SHM_PATH", raising=False)
    so = tmp_path / "copy.so"
    so.write_bytes(default_so().read_bytes())
    return Plugin(so)


@pytest.mark.parametrize("version", TUNER_VERSIONS)
def test_every_tuner_version_runs_and_leaves_nccls_choice_without_a_table(
    plugin: Plugin, version: int
) -> None:
    comm = Comm(plugin, version, 8, 1, comm_id=3)
    cost = realistic_cost_table(4, 1 << 16, 8, 1, nvls=True)
    info = comm.get_coll_info(4, 1 << 16, cost)
    assert (info.algo, info.proto) == nccl_pick(cost)
    comm.finalize()


@pytest.mark.parametrize("version", PROFILER_VERSIONS)
def test_every_profiler_version_asks_for_coll_and_kernel_channel_events(
    plugin: Plugin, version: int
) -> None:
    comm = ProfiledComm(plugin, version, 8, 1, comm_id=5)
    assert comm.mask == (1 << 1) | (1 << 6)  # v7's kernel phases: opt-in
    assert comm.collective(4, 100, b"ncclFloat32", 1, 2, 4, 7.5) == 7500
    comm.finalize()


def _with_table(path: Path, table: DecisionTable, monkeypatch: pytest.MonkeyPatch) -> Plugin:
    """A private copy of the plugin mapping `path`, whose epoch 1 is `table` from call 64 on."""
    with shm.ShmFile(path) as f:
        f.write_table(1, shm_table.encode_table(table, 1))
        f.set_entry(1, shm.EPOCH_COMMITTED, 64)
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    so = path.with_name("copy.so")
    so.write_bytes(default_so().read_bytes())
    return Plugin(so)


def test_play_drives_tuner_and_profiler_with_the_callers_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    sc = scale_class(8, 1)
    table = DecisionTable(
        version=1,
        scales=(sc,),
        cells=(
            Cell(
                collective=Collective.ALLREDUCE,
                bucket=size_bucket(1 << 20),
                scale=sc,
                choices=(Choice(algo=Algo.TREE, proto=Proto.LL128, nchannels=6),),
            ),
        ),
    )
    plugin = _with_table(path, table, monkeypatch)
    comm = Comm(plugin, 5, 8, 1, comm_id=9)
    prof = ProfiledComm(plugin, 5, 8, 1, comm_id=9)

    def time_fn(coll: int, nbytes: int, algo: int, proto: int, nch: int) -> float:
        return 1.0 + nbytes / 1e4 + algo + 10 * proto + 0.5 * nch

    calls = [(4, 1 << 20)] * 70 + [(2, 4096)]
    played = play(comm, calls, time_fn, profiler=prof)
    assert [(p.algo, p.proto, p.nchannels) for p in played[:64]] == [(1, 2, 8)] * 64  # NCCL's
    assert [(p.algo, p.proto, p.nchannels) for p in played[64:70]] == [(0, 1, 6)] * 6  # forced
    assert all(p.exec_ns == int(p.time_us * 1000) for p in played)
    with shm.ShmFile(path) as f:
        (proc,) = f.procs()
        recs = f.drain(proc.index)
    assert [r.exec_ns for r in recs] == [p.exec_ns for p in played]
    assert [r.nbytes for r in recs] == [n for _, n in calls]
    assert (recs[-1].coll, recs[-1].algo) == (2, played[-1].algo)


def test_repeat_decides_as_get_coll_info_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path of long runs: the same decisions, call by call, as getCollInfo one at a
    time (two communicators of one plugin copy, one table from call 64 on)."""
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    sc = scale_class(8, 1)
    cell = Cell(
        collective=Collective.ALLREDUCE,
        bucket=size_bucket(1 << 20),
        scale=sc,
        choices=(Choice(algo=Algo.TREE, proto=Proto.LL128, nchannels=6),),
    )
    table = DecisionTable(version=1, scales=(sc,), cells=(cell,))
    plugin = _with_table(path, table, monkeypatch)
    one, many = Comm(plugin, 5, 8, 1, comm_id=1), Comm(plugin, 5, 8, 1, comm_id=2)
    cost = realistic_cost_table(4, 1 << 20, 8, 1)
    singles = []
    for _ in range(200):
        info = one.get_coll_info(4, 1 << 20, cost)
        singles.append((info.algo, info.proto, info.nchannels))
    assert many.repeat(4, 1 << 20, cost, 200) == singles
    assert singles[63] != singles[64] == (0, 1, 6)


def test_play_call_reports_per_rank_element_counts_and_nccls_channels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call as NCCL runs it, without a table: NCCL's channel count where the plugin left
    0 (asked of the caller), getChunkSize asked after the choice, the caller's time for that
    choice, and the profiler's record with the per-rank element count (AllGather: bytes / 4 /
    ranks)."""
    path = tmp_path / "f.shm"
    shm.create(path, 64)
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    so = tmp_path / "copy.so"
    so.write_bytes(default_so().read_bytes())
    plugin = Plugin(so)
    comm, prof = Comm(plugin, 6, 8, 1, comm_id=4), ProfiledComm(plugin, 5, 8, 1, comm_id=4)
    seen: list[nccl_player.Choice] = []
    asked: list[tuple[int, int, int, int]] = []

    def channels(coll: int, nbytes: int, algo: int, proto: int) -> int:
        asked.append((coll, nbytes, algo, proto))
        return 5

    def time_of(ch: nccl_player.Choice) -> float:
        seen.append(ch)
        return 40.0

    cost = realistic_cost_table(2, 1 << 20, 8, 1)
    p = play_call(comm, 2, 1 << 20, cost, time_of, prof, channels=channels, chunk=True)
    assert (p.algo, p.proto) == nccl_pick(cost)
    assert (p.plugin_channels, p.nchannels) == (0, 5)
    assert asked == [(2, 1 << 20, p.algo, p.proto)]
    assert seen == [nccl_player.Choice(2, 1 << 20, p.algo, p.proto, 5, 0, p.chunk)]
    assert element_count(2, 1 << 20, 8) == (1 << 20) // 32
    assert element_count(4, 2, 8) == 1  # never 0
    with shm.ShmFile(path) as f:
        (proc,) = f.procs()
        (rec,) = f.drain(proc.index)
    assert (rec.coll, rec.nbytes, rec.nchannels) == (2, 1 << 20, 5)
    assert rec.exec_ns == p.exec_ns > 0

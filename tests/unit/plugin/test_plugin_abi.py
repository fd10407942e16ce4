"""The real .so played by the ctypes harness: every ABI version forcing the table, exploration,
buckets and scale classes agreeing with Python, a bad table refused (start-up and missing files:
test_plugin_startup.py)."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    MAX_SCALES,
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    decide,
    scale_class,
    size_bucket,
)
from dynamiccl.sidecar import shm, shm_table
from dynamiccl.testing.nccl_player import (
    IGNORE,
    TUNER_VERSIONS,
    Comm,
    Plugin,
    nccl_pick,
    realistic_cost_table,
    tuning_logs,
)

L = 64


def _table(version: int = 1, **cell_kw: object) -> DecisionTable:
    sc = scale_class(16, 2)
    cells = [
        Cell(
            collective=Collective.ALLREDUCE,
            bucket=size_bucket(1 << 20),
            scale=sc,
            choices=(
                Choice(algo=Algo.NVLS, proto=Proto.SIMPLE, nchannels=24),
                Choice(algo=Algo.RING, proto=Proto.LL128, nchannels=8, chunk_bytes=1 << 17),
            ),
        ),
        Cell(
            collective=Collective.ALLGATHER,
            bucket=size_bucket(4096),
            scale=sc,
            choices=(Choice(algo=Algo.RING, proto=Proto.LL),),
        ),
    ]
    return DecisionTable(version=version, scales=(sc,), cells=tuple(cells), **cell_kw)


def _commit(f: shm.ShmFile, epoch: int, table: DecisionTable, boundary: int) -> None:
    f.write_table(epoch, shm_table.encode_table(table, epoch))
    f.set_entry(epoch, shm.EPOCH_COMMITTED, boundary)


def _advance(comm: Comm, n: int) -> None:
    cost = realistic_cost_table(1, 64, comm.nranks, comm.nnodes)
    for _ in range(n):
        comm.get_coll_info(1, 64, cost)


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_forces_only_available_entries_and_sets_channels(
    shm_file: shm.ShmFile, plugin: Plugin, version: int
) -> None:
    _commit(shm_file, 1, _table(), L)
    comm = Comm(plugin, version, 16, 2, comm_id=9)
    _advance(comm, L)  # calls 0..63 run on NCCL's choice; epoch 1 starts at call 64
    with_nvls = realistic_cost_table(4, 1 << 20, 16, 2, nvls=True)
    info = comm.get_coll_info(4, 1 << 20, with_nvls)
    assert (info.algo, info.proto, info.nchannels) == (4, 2, 24)
    assert info.cost[4][2] == 0.0
    untouched = [(a, p) for a in range(7) for p in range(3) if (a, p) != (4, 2)]
    assert all(info.cost[a][p] == pytest.approx(with_nvls[a][p]) for a, p in untouched)
    # NVLS unavailable (-1.0): the next ranked choice, and -1.0 entries stay -1.0
    no_nvls = realistic_cost_table(4, 1 << 20, 16, 2)
    info = comm.get_coll_info(4, 1 << 20, no_nvls)
    assert (info.algo, info.proto, info.nchannels) == (1, 1, 8)
    assert all(
        info.cost[a][p] == IGNORE for a in range(7) for p in range(3) if no_nvls[a][p] == IGNORE
    )
    if version == 6:
        assert comm.chunk_size(4, 1 << 20, 1, 1, 8, nccl_chunk=1 << 19) == 1 << 17
        assert comm.chunk_size(4, 1 << 20, 0, 2, 8, nccl_chunk=1 << 19) == 1 << 19  # not our choice
    # nothing available at all: NCCL's own choice, nothing touched
    only_tree = [[IGNORE] * 3 for _ in range(7)]
    only_tree[0][2] = 5.0
    info = comm.get_coll_info(4, 1 << 20, only_tree)
    assert info.cost == only_tree
    assert info.nchannels == 0
    # a cell the table does not have: untouched
    cost = realistic_cost_table(0, 1 << 20, 16, 2)
    assert comm.get_coll_info(0, 1 << 20, cost).cost == [
        [pytest.approx(v) for v in r] for r in cost
    ]
    assert not any("unusable" in m for _, m in plugin.logs)


def test_v2_returns_algorithm_and_protocol(shm_file: shm.ShmFile, plugin: Plugin) -> None:
    _commit(shm_file, 1, _table(), L)
    comm = Comm(plugin, 2, 16, 2)
    _advance(comm, L)
    with_collnet = realistic_cost_table(4, 1 << 20, 16, 2, nvls=True, collnet=True)
    info = comm.get_coll_info(4, 1 << 20, with_collnet)  # NCCL 2.21: multi-node NVLS needs CollNet
    assert (info.algo, info.proto, info.nchannels) == (4, 2, 24)
    info = comm.get_coll_info(4, 1 << 20, realistic_cost_table(4, 1 << 20, 16, 2))
    assert (info.algo, info.proto, info.nchannels) == (1, 1, 8)


@pytest.mark.parametrize("var", ["NCCL_ALGO", "NCCL_PROTO"])
def test_user_nccl_algo_or_proto_is_never_fought(
    shm_file: shm.ShmFile, plugin: Plugin, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    monkeypatch.setenv(var, "Ring" if var == "NCCL_ALGO" else "Simple")
    _commit(shm_file, 1, _table(), L)
    comm = Comm(plugin, 6, 16, 2)
    _advance(comm, L)
    cost = realistic_cost_table(4, 1 << 20, 16, 2, nvls=True)
    info = comm.get_coll_info(4, 1 << 20, cost)
    assert info.cost == [[pytest.approx(v) for v in r] for r in cost]
    assert info.nchannels == 0
    assert any("set by the user" in m for _, m in plugin.logs)


def test_corrupt_table_is_passthrough_with_one_log_line(
    shm_file: shm.ShmFile, plugin: Plugin
) -> None:
    image = bytearray(shm_table.encode_table(_table(), 1))
    image[200] ^= 0x01  # CRC mismatch
    shm_file.write_table(1, bytes(image))
    shm_file.set_entry(1, shm.EPOCH_COMMITTED, L)
    comm = Comm(plugin, 6, 16, 2)
    _advance(comm, 3 * L)
    cost = realistic_cost_table(4, 1 << 20, 16, 2, nvls=True)
    for _ in range(5):
        assert comm.get_coll_info(4, 1 << 20, cost).nchannels == 0
    unusable = [m for _, m in plugin.logs if "unusable" in m]
    assert len(unusable) == 1


def test_exploration_matches_the_python_reference(shm_file: shm.ShmFile, plugin: Plugin) -> None:
    sc = scale_class(16, 2)
    cands = (
        Candidate(algo=Algo.TREE, proto=Proto.LL, weight=3),
        Candidate(algo=Algo.RING, proto=Proto.SIMPLE, nchannels=4, weight=1),
        Candidate(algo=Algo.PAT, proto=Proto.SIMPLE, weight=2),
    )
    table = DecisionTable(
        version=3,
        scales=(sc,),
        explore=ExploreSchedule(seed=1234, half_life_log2=7),
        cells=(
            Cell(
                collective=Collective.ALLREDUCE,
                bucket=12,
                scale=sc,
                explore=0.6,
                choices=(Choice(algo=Algo.RING, proto=Proto.LL128),),
                candidates=cands,
            ),
        ),
    )
    _commit(shm_file, 1, table, L)
    comm = Comm(plugin, 5, 16, 2, comm_id=0xDEADBEEF)
    _advance(comm, L)
    cost = realistic_cost_table(4, 4096, 16, 2)  # PAT unavailable for all-reduce: falls back
    seen = set()
    for j in range(600):
        info = comm.get_coll_info(4, 4096, cost)
        ref = decide(
            table,
            Collective.ALLREDUCE,
            4096,
            16,
            2,
            0xDEADBEEF,
            j,
            lambda c: cost[c.algo.nccl_id][c.proto.nccl_id] != IGNORE,
        )
        assert ref is not None
        assert (info.algo, info.proto, info.nchannels) == (
            ref.algo.nccl_id,
            ref.proto.nccl_id,
            ref.nchannels,
        )
        seen.add((info.algo, info.proto))
    assert {(0, 0), (1, 2), (1, 1)} <= seen  # explored early, settled on the ranked choice later


def _channel_coded(scales: list[int]) -> DecisionTable:
    """One all-reduce choice per (scale, bucket) whose channel count names the cell:
    1 + bucket + 41 * (the scale's index)."""
    cells = tuple(
        Cell(
            collective=Collective.ALLREDUCE,
            bucket=b,
            scale=s,
            choices=(Choice(algo=Algo.RING, proto=Proto.SIMPLE, nchannels=1 + b + 41 * i),),
        )
        for i, s in enumerate(scales)
        for b in range(41)
    )
    return DecisionTable(version=1, scales=tuple(scales), cells=cells)


def test_bucket_and_scale_class_agree_with_python(shm_file: shm.ShmFile, plugin: Plugin) -> None:
    """One choice per (bucket, scale) cell: the plugin's forced entry reveals its bucket/scale."""
    rng = random.Random(5)
    shapes = [(rng.randint(1, 4096), rng.randint(1, 256)) for _ in range(40)] + [
        (1, 1),
        (8, 1),
        (16, 2),
    ]
    # encode the scale into channels: one table, 4 scales, and probe many sizes
    scales = sorted({scale_class(r, n) for r, n in shapes})[:4]
    _commit(shm_file, 1, _channel_coded(scales), L)
    probes = [(r, n) for r, n in shapes if scale_class(r, n) in scales][:6]
    sizes = [0, 1, 2, 3, 1023, 1024, 1025, (1 << 40) - 1, 1 << 40, (1 << 62) + 5]
    sizes += [rng.randint(1, 1 << 45) for _ in range(200)]
    for nranks, nnodes in probes:
        comm = Comm(plugin, 6, nranks, nnodes)
        _advance(comm, L)
        i = scales.index(scale_class(nranks, nnodes))
        for n in sizes:
            info = comm.get_coll_info(4, n, realistic_cost_table(4, 1, nranks, nnodes))
            assert info.nchannels == 1 + size_bucket(n) + 41 * i, (nranks, nnodes, n)
    assert nccl_pick([[IGNORE] * 3] * 7) is None


def test_large_scale_classes_agree_with_python(shm_file: shm.ShmFile, plugin: Plugin) -> None:
    """1 024, 12 000 and over 2^14 nodes, and an NVL72 domain: each its own scale class in the
    plugin, the one Python computes (one table; the channels reveal which cell ran)."""
    shapes = [(8192, 1024), (96000, 12000), (8 * 20000, 20000), (72 * 18, 18)]
    scales = [scale_class(r, n) for r, n in shapes]
    assert len(set(scales)) == len(shapes)
    _commit(shm_file, 1, _channel_coded(scales), L)
    for i, (nranks, nnodes) in enumerate(shapes):
        comm = Comm(plugin, 6, nranks, nnodes)
        _advance(comm, L)
        for n in (1, 1 << 20, 1 << 40):
            info = comm.get_coll_info(4, n, realistic_cost_table(4, 1, nranks, nnodes))
            assert info.nchannels == 1 + size_bucket(n) + 41 * i, (nranks, nnodes, n)
    other = Comm(plugin, 6, 1024, 128)  # 128 nodes: not in the table, NCCL's own choice
    _advance(other, L)
    assert other.get_coll_info(4, 1 << 20, realistic_cost_table(4, 1, 1024, 128)).nchannels == 0


@pytest.mark.parametrize("version", TUNER_VERSIONS)
def test_no_table_yet_is_passthrough_with_one_log_line(
    shm_file: shm.ShmFile, plugin: Plugin, version: int
) -> None:
    comm = Comm(plugin, version, 16, 2, comm_id=4)
    for i in range(5 * L + 3):
        cost = realistic_cost_table(4, 1 << (i % 24), 16, 2, nvls=True)
        info = comm.get_coll_info(4, 1 << (i % 24), cost)
        assert info.cost == [[pytest.approx(v) for v in row] for row in cost]
        assert info.nchannels == 0
    logs = tuning_logs(plugin)
    assert len(logs) == 1
    assert "using" in logs[0]
    (proc,) = shm_file.procs()
    assert proc.max_boundary == 5 * L  # it still publishes its progress for the votes


def test_table_validation_agrees_between_python_and_the_plugin(
    so_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Corrupt one byte (re-sealing the CRC most of the time): the plugin's logged reason is
    the code the sidecar's codec computes for the same image."""
    rng = random.Random(11)
    base = bytearray(shm_table.encode_table(_table(), 1))
    seen = set()
    for case in range(40):
        image = bytearray(base)
        at = rng.randrange(8, 64) if case % 2 else rng.randrange(64, 64 + 48 * 40)
        image[at] = rng.randrange(256)
        if case % 5:
            struct.pack_into("<I", image, 4, zlib.crc32(bytes(image[8:])))
        expected = shm_table.validate_table(bytes(image), 1)
        seen.add(expected)
        path = tmp_path / f"c{case}.shm"
        shm.create(path, L)
        with shm.ShmFile(path) as f:
            f.write_table(1, bytes(image))
            f.set_entry(1, shm.EPOCH_COMMITTED, L)
        monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
        so = tmp_path / f"c{case}.so"
        so.write_bytes(so_path.read_bytes())
        p = Plugin(so)
        comm = Comm(p, 6, 16, 2)
        _advance(comm, L + 1)
        reasons = [m for _, m in p.logs if "unusable" in m]
        if expected == 0:
            assert reasons == [], (case, at)
        else:
            assert len(reasons) == 1, (case, at)
            assert f"reason {expected})" in reasons[0], (case, at, reasons)
    assert len(seen) >= 3  # the cases reach several different checks


def test_a_table_of_eight_scale_classes_tunes_eight_communicator_shapes(
    shm_file: shm.ShmFile, plugin: Plugin
) -> None:
    """The communicators of a TP=4, CP=2, PP=4, DP=8 job on 32 nodes of 8 (world, node, TP,
    CP, DP, DP x CP, PP) and one more: each shape's communicator runs its own cell."""
    shapes = [(256, 32), (8, 1), (4, 1), (2, 1), (8, 8), (16, 8), (4, 4), (2, 2)]
    scales = [scale_class(n, k) for n, k in shapes]
    assert len(set(scales)) == MAX_SCALES == 8
    cells = tuple(
        Cell(
            collective=Collective.ALLREDUCE,
            bucket=20,
            scale=s,
            choices=(Choice(algo=Algo.RING, proto=Proto.SIMPLE, nchannels=1 + i),),
        )
        for i, s in enumerate(scales)
    )
    _commit(shm_file, 1, DecisionTable(version=1, scales=tuple(scales), cells=cells), L)
    for i, (nranks, nnodes) in enumerate(shapes):
        comm = Comm(plugin, 6, nranks, nnodes, comm_id=0xC0 + i)
        _advance(comm, L)
        info = comm.get_coll_info(4, 1 << 20, realistic_cost_table(4, 1 << 20, nranks, nnodes))
        assert (info.algo, info.proto, info.nchannels) == (1, 2, 1 + i), (nranks, nnodes)

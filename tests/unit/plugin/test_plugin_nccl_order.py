"""The real .so called the way real NCCL calls it (issue 18).

* tuner v6 (NCCL >= 2.30): a group's getCollInfo calls, one per aggregated task, then getChunkSize
  per task and channel range with one channel's bytes (nChannels = 1; the whole task for CollNet);
* tuner v2 (only NCCL 2.21 uses it): no algorithm 2.21 rules out is ever returned;
* no profiler init before a tuner's: one warning through NCCL's logger, and the ABI versions NCCL
  loaded are in the process slot for the sidecar.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, scale_class, size_bucket
from dynamiccl.sidecar import shm, shm_table
from dynamiccl.testing.nccl_player import (
    NO_PROFILER,
    Comm,
    Plugin,
    ProfiledComm,
    realistic_cost_table,
)

L = 64
NCCL_CHUNK = 1 << 19  # NCCL's chunk before asking; kept unless the table decides


def _commit(f: shm.ShmFile, cells: tuple[Cell, ...], nranks: int, nnodes: int) -> None:
    table = DecisionTable(version=1, scales=(scale_class(nranks, nnodes),), cells=cells)
    f.write_table(1, shm_table.encode_table(table, 1))
    f.set_entry(1, shm.EPOCH_COMMITTED, L)


def _cell(coll: Collective, nbytes: int, nranks: int, nnodes: int, *choices: Choice) -> Cell:
    return Cell(
        collective=coll,
        bucket=size_bucket(nbytes),
        scale=scale_class(nranks, nnodes),
        choices=choices,
    )


def _advance(comm: Comm) -> None:
    cost = realistic_cost_table(1, 64, comm.nranks, comm.nnodes)
    for _ in range(L):  # calls 0..63 run on NCCL's choice; the table is in effect from call 64
        comm.get_coll_info(1, 64, cost)


def test_chunk_size_in_nccls_call_order(shm_file: shm.ShmFile, plugin: Plugin) -> None:
    ar, ag = 8 << 20, 1 << 20  # an all-reduce and an all-gather aggregate (nRanks x count bytes)
    _commit(
        shm_file,
        (
            _cell(
                Collective.ALLREDUCE,
                ar,
                8,
                1,
                Choice(algo=Algo.RING, proto=Proto.LL128, chunk_bytes=1 << 17),
            ),
            _cell(
                Collective.ALLGATHER,
                ag,
                8,
                1,
                Choice(algo=Algo.RING, proto=Proto.SIMPLE, chunk_bytes=1 << 18),
            ),
        ),
        8,
        1,
    )
    comm = Comm(plugin, 6, 8, 1, comm_id=3)
    _advance(comm)
    # the group: every aggregate's getCollInfo first ...
    info_ar = comm.get_coll_info(4, ar, realistic_cost_table(4, ar, 8, 1))
    info_ag = comm.get_coll_info(2, ag, realistic_cost_table(2, ag, 8, 1))
    assert (info_ar.algo, info_ar.proto) == (1, 1)
    assert (info_ag.algo, info_ag.proto) == (1, 2)
    # ... then getChunkSize per task and channel range, with one channel's bytes (16 channels)
    slice_ar, slice_ag = ar // 16, ag // 16
    assert comm.chunk_size(4, slice_ar, 1, 1, 1, nccl_chunk=NCCL_CHUNK) == 1 << 17
    assert comm.chunk_size(4, slice_ar - 4096, 1, 1, 1, nccl_chunk=NCCL_CHUNK) == 1 << 17
    assert comm.chunk_size(2, slice_ag, 1, 2, 1, nccl_chunk=NCCL_CHUNK) == 1 << 18
    # what the table did not decide keeps NCCL's chunk
    assert comm.chunk_size(4, slice_ar, 1, 2, 1, nccl_chunk=NCCL_CHUNK) == NCCL_CHUNK
    assert comm.chunk_size(3, slice_ag, 1, 2, 1, nccl_chunk=NCCL_CHUNK) == NCCL_CHUNK
    # the next group's getCollInfo retires this group's decisions
    comm.get_coll_info(2, ag, realistic_cost_table(2, ag, 8, 1))
    assert comm.chunk_size(4, slice_ar, 1, 1, 1, nccl_chunk=NCCL_CHUNK) == NCCL_CHUNK
    assert comm.chunk_size(2, slice_ag, 1, 2, 1, nccl_chunk=NCCL_CHUNK) == 1 << 18
    comm.finalize()


def test_chunk_size_is_rank_identical(shm_file: shm.ShmFile, fresh_so: Path) -> None:
    """Two ranks (separate copies of the .so) answer the same call sequence identically."""
    sizes = [1 << s for s in range(12, 26, 3)]
    cells = tuple(
        _cell(
            Collective.ALLREDUCE,
            n,
            16,
            2,
            Choice(algo=Algo.RING, proto=Proto.LL128, chunk_bytes=1 << (14 + i % 4)),
        )
        for i, n in enumerate(sizes)
    )
    _commit(shm_file, cells, 16, 2)
    answers = []
    for rank in range(2):
        copy = fresh_so.with_name(f"rank{rank}.so")
        copy.write_bytes(fresh_so.read_bytes())
        comm = Comm(Plugin(copy), 6, 16, 2, comm_id=11)
        _advance(comm)
        seen = []
        for group in range(len(sizes)):
            members = sizes[: group + 1]
            for n in members:
                comm.get_coll_info(4, n, realistic_cost_table(4, n, 16, 2))
            for n in members:
                for nch in (1, 4, 16):
                    seen.append(comm.chunk_size(4, n // nch, 1, 1, 1, nccl_chunk=NCCL_CHUNK))
        answers.append(seen)
        comm.finalize()
    assert answers[0] == answers[1]
    assert any(a != NCCL_CHUNK for a in answers[0])


def test_v2_never_returns_nvls_nccl_2_21_rules_out(shm_file: shm.ShmFile, plugin: Plugin) -> None:
    nvls_first = (
        Choice(algo=Algo.NVLS, proto=Proto.SIMPLE, nchannels=24),
        Choice(algo=Algo.RING, proto=Proto.LL128, nchannels=8),
    )
    _commit(
        shm_file,
        (
            _cell(Collective.ALLREDUCE, 1 << 20, 16, 2, *nvls_first),
            _cell(Collective.ALLGATHER, 1 << 20, 16, 2, *nvls_first),
        ),
        16,
        2,
    )
    comm = Comm(plugin, 2, 16, 2)
    _advance(comm)
    # 2 nodes, NVLS present, no CollNet: 2.21 rules NVLS out -> the next choice
    info = comm.get_coll_info(4, 1 << 20, realistic_cost_table(4, 1 << 20, 16, 2, nvls=True))
    assert (info.algo, info.proto, info.nchannels) == (1, 1, 8)
    # with CollNet, multi-node NVLS all-reduce is allowed
    both = realistic_cost_table(4, 1 << 20, 16, 2, nvls=True, collnet=True)
    info = comm.get_coll_info(4, 1 << 20, both)
    assert (info.algo, info.proto, info.nchannels) == (4, 2, 24)
    # NVLS all-gather on more than one node: never, CollNet or not
    ag = realistic_cost_table(2, 1 << 20, 16, 2, nvls=True)
    ag[3][2] = 1.0  # the harness derives collNetSupport from the CollNet entries
    info = comm.get_coll_info(2, 1 << 20, ag)
    assert (info.algo, info.proto) == (1, 1)


def _slot_abi() -> tuple[int, int]:
    """(tuner_abi, profiler_abi) of process slot 0: bytes 32 and 33 of its header."""
    data = Path(os.environ["DYNAMICCL_SHM_PATH"]).read_bytes()
    tuner, profiler = struct.unpack_from("<BB", data, shm.PROCS_OFF + 32)
    return tuner, profiler


@pytest.mark.parametrize("version", [2, 3, 4])
def test_no_profiler_is_reported_once(shm_file: shm.ShmFile, plugin: Plugin, version: int) -> None:
    for _ in range(3):
        Comm(plugin, version, 8, 1).finalize()
    notices = [m for _, m in plugin.logs if NO_PROFILER in m]
    assert len(notices) == 1
    assert f"tuner ABI v{version}" in notices[0]
    assert _slot_abi() == (version, 0)


def test_profiler_then_tuner_is_silent(shm_file: shm.ShmFile, plugin: Plugin) -> None:
    """NCCL >= 2.27 inits the profiler of a communicator before its tuner."""
    prof = ProfiledComm(plugin, 5, 8, 1, comm_id=2)
    comm = Comm(plugin, 5, 8, 1, comm_id=2)
    assert not any(NO_PROFILER in m for _, m in plugin.logs)
    assert _slot_abi() == (5, 5)
    comm.finalize()
    prof.finalize()


def test_v7_in_nccls_call_order_records_the_tag_and_the_phases(
    shm_file: shm.ShmFile, plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL 2.31.2+/2.32.6: profiler v7 init, tuner v7 init, then per call getCollInfo and the
    Coll / KernelCh / KernelPhase events; the record carries the call's tag and phase times."""
    monkeypatch.setenv("DYNAMICCL_KERNEL_PHASES", "1")  # phases are opt-in (their cost)
    prof = ProfiledComm(plugin, 7, 8, 1, comm_id=21)
    assert prof.mask == (1 << 1) | (1 << 6) | (1 << 15)
    comm = Comm(plugin, 7, 8, 1, comm_id=21)
    assert _slot_abi() == (7, 7)
    info = comm.get_coll_info(4, 1 << 17, realistic_cost_table(4, 1 << 17, 8, 1))
    prof.collective(4, 1 << 15, b"ncclFloat32", info.algo, info.proto, 4, 9.0, user_tag=42)
    prof.collective(
        4, 1 << 15, b"ncclFloat32", 1, 2, 2, 3.0, variant=b"AGxLL_R", phases_ns=(400, 2000, 100)
    )
    prof.collective(4, 1 << 15, b"ncclFloat32", info.algo, info.proto, 4, 9.0)
    comm.finalize()
    prof.finalize()
    (proc,) = shm_file.procs()
    tagged, sym, plain = shm_file.drain(proc.index)
    assert (tagged.user_tag, tagged.flags, tagged.phase_ns) == (42, shm.REC_V7, (0, 0, 0))
    assert (tagged.exec_ns, tagged.nbytes, tagged.algo) == (9000, 1 << 17, info.algo)
    assert sym.flags == shm.REC_V7 | shm.REC_SYMMETRIC
    assert (sym.phase_ns, sym.n_phases, sym.user_tag) == ((400, 2000, 100), 6, 0)
    assert (plain.user_tag, plain.n_phases) == (0, 0)


@pytest.mark.parametrize("version", [5, 6])
def test_older_profilers_write_no_tag(shm_file: shm.ShmFile, plugin: Plugin, version: int) -> None:
    prof = ProfiledComm(plugin, version, 8, 1, comm_id=22)
    prof.collective(4, 1 << 15, b"ncclFloat32", 1, 2, 4, 5.0)
    prof.finalize()
    (proc,) = shm_file.procs()
    (rec,) = shm_file.drain(proc.index)
    assert (rec.user_tag, rec.flags, rec.exec_ns) == (0, 0, 5000)

"""The sidecar's protocol steps against a real plugin process slot (this test process)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from dynamiccl.agent import shm, shm_table
from dynamiccl.agent.cas import FileCAS, load_record, update_record
from dynamiccl.agent.coordinator import Coordinator, DirTableStore, init_record
from dynamiccl.agent.harness import Comm, Plugin, default_so, realistic_cost_table
from dynamiccl.agent.participant import WARN_AFTER_NO_VOTES, Participant
from dynamiccl.api.epoch import EpochStatus, propose, resolve, vote
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, scale_class, size_bucket

L = 64
SC = scale_class(8, 1)
TABLE = DecisionTable(
    version=1,
    scales=(SC,),
    cells=(
        Cell(
            collective=Collective.ALLREDUCE,
            bucket=size_bucket(4096),
            scale=SC,
            choices=(Choice(algo=Algo.RING, proto=Proto.LL, nchannels=13),),
        ),
    ),
)


class Env:
    def __init__(self, tmp: Path, voters: tuple[str, ...], mp: pytest.MonkeyPatch) -> None:
        self.cas = FileCAS(tmp / "rec.json")
        init_record(self.cas, L, voters)
        self.tables = DirTableStore(tmp / "tables")
        self.path = tmp / "pod.shm"
        shm.create(self.path, L)
        self.shm = shm.ShmFile(self.path)
        self.coord = Coordinator(self.cas, self.tables, lead=4)
        so = tmp / "copy.so"
        shutil.copy(default_so(), so)
        mp.setenv("DYNAMICCL_SHM_PATH", str(self.path))
        self.plugin = Plugin(so)
        self.comm = Comm(self.plugin, 6, 8, 1, comm_id=1)  # registers this process in the file
        self.cost = realistic_cost_table(4, 4096, 8, 1)
        self.calls = 0
        self.now = 0.0

    def advance(self, n: int) -> list[int]:
        out = [self.comm.get_coll_info(4, 4096, self.cost).nchannels for _ in range(n)]
        self.calls += n
        return out

    def participant(self, voter: str, expected: int = 1) -> Participant:
        return Participant(self.cas, self.tables, self.shm, voter, expected, 2.0, lambda: self.now)

    def status(self, e: int) -> EpochStatus:
        rec, _ = load_record(self.cas)
        assert rec is not None
        return rec.epochs[e - 1].status


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    return Env(tmp_path, ("pod0",), monkeypatch)


def test_yes_vote_commits_and_the_table_takes_effect_at_k(env: Env) -> None:
    env.advance(10)
    assert env.coord.publish(TABLE) == 1
    p = env.participant("pod0")
    p.step()
    assert env.status(1) == EpochStatus.COMMITTED
    p.step()
    status, k = env.shm.entry(1)
    assert status == shm.EPOCH_COMMITTED
    before = env.advance(k - env.calls)
    after = env.advance(5)
    assert set(before) == {0}
    assert set(after) == {13}


def test_a_process_already_past_k_makes_the_vote_no(env: Env) -> None:
    env.advance(400)  # published boundary 384
    update_record(env.cas, lambda r: propose(r, TABLE.version, TABLE.digest, lead=0))  # K = 64
    env.tables.put(TABLE)
    p = env.participant("pod0")
    p.step()
    assert env.status(1) == EpochStatus.ABORTED
    p.step()
    assert env.shm.entry(1)[0] == shm.EPOCH_ABORTED
    assert set(env.advance(200)) == {0}


def test_missing_table_or_missing_process_votes_no(env: Env) -> None:
    update_record(env.cas, lambda r: propose(r, 99, 1234))
    env.participant("pod0").step()
    assert env.status(1) == EpochStatus.ABORTED
    env.participant("pod0").step()
    assert env.coord.publish(TABLE) == 2
    env.participant("pod0", expected=2).step()  # only this process registered
    assert env.status(2) == EpochStatus.ABORTED


def test_waiting_ranks_make_the_sidecar_abort_after_a_grace_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = Env(tmp_path, ("pod0", "pod1"), monkeypatch)
    env.advance(10)
    assert env.coord.publish(TABLE) == 1
    p = env.participant("pod0", expected=1)
    p.step()  # votes yes; pod1 never votes (its sidecar is dead)
    assert env.status(1) == EpochStatus.PENDING
    k = env.shm.entry(1)[1]
    # another rank process of this pod reached K and is waiting there
    slot = shm.PROCS_OFF + 5 * shm.PROC_SLOT_SIZE
    shm._Word(env.shm._buf, slot).store(os.getppid())
    shm._Word(env.shm._buf, slot + 8).store(k)
    env.now = 100.0
    p.step()
    assert env.status(1) == EpochStatus.PENDING  # the grace period starts
    env.now = 101.0
    p.step()
    assert env.status(1) == EpochStatus.PENDING
    env.now = 102.5
    p.step()
    assert env.status(1) == EpochStatus.ABORTED
    restarted = env.participant("pod0", expected=1)  # a restarted sidecar mirrors the outcome
    restarted.step()
    assert env.shm.entry(1) == (shm.EPOCH_ABORTED, k)


def test_a_slot_holding_another_table_or_an_incompatible_l_votes_no(env: Env) -> None:
    other = TABLE.model_copy(update={"version": 2})
    env.shm.write_table(1, shm_table.encode_table(other, 1))  # e.g. left over in a reused file
    assert env.coord.publish(TABLE) == 1
    env.participant("pod0").step()
    assert env.status(1) == EpochStatus.ABORTED
    assert env.shm.read_table(1) == shm_table.encode_table(other, 1)  # never overwritten
    env.participant("pod0").step()
    assert env.shm.entry(1)[0] == shm.EPOCH_ABORTED


def test_boundaries_the_files_l_cannot_express_get_a_no_and_are_not_mirrored(
    tmp_path: Path,
) -> None:
    cas = FileCAS(tmp_path / "rec.json")
    init_record(cas, 128, ("pod0",))
    tables = DirTableStore(tmp_path / "t")
    tables.put(TABLE)
    shm.create(tmp_path / "f.shm", 256)
    with shm.ShmFile(tmp_path / "f.shm") as f:
        update_record(cas, lambda r: propose(r, TABLE.version, TABLE.digest, lead=1))  # K = 128
        p = Participant(cas, tables, f, "pod0", expected_procs=0)
        p.step()
        p.step()
        rec, _ = load_record(cas)
        assert rec is not None
        assert rec.epochs[0].status == EpochStatus.ABORTED
        assert f.entry(1) == (shm.EPOCH_NONE, 0)
        update_record(cas, lambda r: propose(r, TABLE.version, TABLE.digest, lead=2))  # K = 256
        p.step()
        rec, _ = load_record(cas)
        assert rec is not None
        assert rec.epochs[1].status == EpochStatus.ABORTED  # blocked behind epoch 1
        assert f.entry(2) == (shm.EPOCH_NONE, 0)


def test_a_joining_sidecar_publishes_the_file_with_the_whole_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cas = FileCAS(tmp_path / "rec.json")
    init_record(cas, L, ("pod0",))
    tables = DirTableStore(tmp_path / "t")
    coord = Coordinator(cas, tables, lead=1)
    assert coord.publish(TABLE) == 1
    update_record(cas, lambda r: resolve(vote(r, "pod0", 1, True)))  # committed before we exist
    path = tmp_path / "late.shm"

    def prepare(f: shm.ShmFile) -> None:
        assert not path.exists()  # nobody can map it half-made
        Participant(cas, tables, f, "pod1", expected_procs=1).step()

    shm.create(path, L, prepare)
    with shm.ShmFile(path) as f:
        status, k = f.entry(1)
        assert status == shm.EPOCH_COMMITTED
        assert shm_table.validate_table(f.read_table(1), 1) == 0
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    so = tmp_path / "copy.so"
    shutil.copy(default_so(), so)
    plugin = Plugin(so)
    comm = Comm(plugin, 6, 8, 1, comm_id=1)  # a new communicator replays the history
    cost = realistic_cost_table(4, 4096, 8, 1)
    chans = [comm.get_coll_info(4, 4096, cost).nchannels for _ in range(k + 3)]
    assert set(chans[:k]) == {0}
    assert set(chans[k:]) == {13}
    assert not any("seen first" in m for _, m in plugin.logs)


def test_a_process_that_maps_the_file_late_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.shm"
    monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(path))
    so = tmp_path / "copy.so"
    shutil.copy(default_so(), so)
    plugin = Plugin(so)
    comm = Comm(plugin, 6, 8, 1, comm_id=1)
    cost = realistic_cost_table(4, 4096, 8, 1)
    for _ in range(100):  # before the file exists: NCCL's choice
        comm.get_coll_info(4, 4096, cost)

    def prepare(f: shm.ShmFile) -> None:
        f.write_table(1, shm_table.encode_table(TABLE, 1))
        f.set_entry(1, shm.EPOCH_COMMITTED, L)

    shm.create(path, L, prepare)
    chans = [comm.get_coll_info(4, 4096, cost).nchannels for _ in range(4096)]
    assert set(chans[: 4096 - 100]) == {0}  # the next probe for the file is at call 4096
    assert set(chans[4096 - 100 :]) == {13}
    late = [m for _, m in plugin.logs if "seen first at call 4096" in m]
    assert len(late) == 1


def test_a_pod_missing_processes_says_why_its_votes_keep_the_table_out(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """A pod running fewer NCCL processes than the job's processes per pod never lets a
    table take effect; after a few epochs its sidecar warns and names the counts."""
    env.advance(10)
    caplog.set_level(logging.INFO, logger="dynamiccl.agent.participant")
    p = env.participant("pod0", expected=4)  # this test process is the only one registered
    for e in range(1, WARN_AFTER_NO_VOTES + 1):
        assert env.coord.publish(TABLE.model_copy(update={"version": e})) == e
        p.step()
        assert env.status(e) == EpochStatus.ABORTED
    rec, _ = load_record(env.cas)
    assert rec is not None
    assert rec.epochs[0].reason == "voted no: ['pod0']"
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "1 of the 4 NCCL processes" in infos[0]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "voted no on 3 epochs in a row" in warned[0]
    assert "1 of the 4 NCCL processes" in warned[0]

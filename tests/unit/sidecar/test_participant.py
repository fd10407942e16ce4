"""The sidecar's protocol steps against a real plugin process slot (this test process)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from dynamiccl.api.epoch import KEPT_EPOCHS, EpochRecord, EpochStatus, propose, resolve, vote
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, scale_class, size_bucket
from dynamiccl.sidecar import shm, shm_table
from dynamiccl.sidecar.ballots import Ballot, BallotBox
from dynamiccl.sidecar.cas import FileCAS, load_record, update_record
from dynamiccl.sidecar.participant import WARN_AFTER_NO_VOTES, Participant
from dynamiccl.sidecar.proposer import Coordinator, DirTableStore, init_record
from dynamiccl.testing.nccl_player import Comm, Plugin, default_so, realistic_cost_table

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


def table(version: int) -> DecisionTable:
    """TABLE as `version`, choosing `version` channels: every decision shows its table."""
    cell = TABLE.cells[0]
    choice = Choice(algo=Algo.RING, proto=Proto.LL, nchannels=version)
    return TABLE.model_copy(
        update={"version": version, "cells": (cell.model_copy(update={"choices": (choice,)}),)}
    )


class Pod:
    """A pod's participant, each step followed by the proposer's (it folds the ballots into
    the record, as the lease holder's sidecar does at its next step)."""

    def __init__(self, participant: Participant, coord: Coordinator) -> None:
        self.participant, self.coord = participant, coord

    def step(self) -> None:
        self.participant.step()
        self.coord.step()


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

    def participant(self, voter: str, expected: int = 1) -> Pod:
        p = Participant(self.cas, self.tables, self.shm, voter, expected, 2.0, lambda: self.now)
        return Pod(p, self.coord)

    def commit(self, version: int, expected: int = 1) -> bool:
        """Publish `table(version)`, let pod0 vote and mirror, then play this rank past the
        boundary (pod0's next report carries its progress and needs)."""
        if self.coord.publish(table(version)) is None:
            return False
        p = self.participant("pod0", expected)
        p.step()
        p.step()
        ep = self.record().epochs[-1]
        if ep.status != EpochStatus.COMMITTED:
            return False
        self.advance(ep.boundary + L - self.calls)
        p.step()
        return True

    def record(self) -> EpochRecord:
        rec, _ = load_record(self.cas)
        assert rec is not None
        return rec

    def view(self) -> EpochRecord:
        """The record as the proposer sees it: the stored one with the pods' ballots folded in
        (their reports reach the stored record with the next proposal)."""
        rec = self.coord.step()
        assert rec is not None
        return rec

    def status(self, e: int) -> EpochStatus:
        return self.record().epochs[e - 1].status


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
    assert env.coord.publish(TABLE) == 1  # an aborted epoch's number is proposed again
    env.participant("pod0", expected=2).step()  # only this process registered
    assert env.status(1) == EpochStatus.ABORTED


def _aborts_after_grace(env: Env, p: Pod, start: float) -> None:
    """Epoch 1 stays pending while a rank waits at its boundary for less than the sidecar's
    2 s grace (from `start` on), and is aborted once it waited longer."""
    env.now = start
    p.step()
    assert env.status(1) == EpochStatus.PENDING  # the grace period starts
    env.now = start + 1.0
    p.step()
    assert env.status(1) == EpochStatus.PENDING
    env.now = start + 2.5
    p.step()
    assert env.status(1) == EpochStatus.ABORTED


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
    _aborts_after_grace(env, p, 100.0)
    restarted = env.participant("pod0", expected=1)  # a restarted sidecar mirrors the outcome
    restarted.step()
    assert env.shm.entry(1) == (shm.EPOCH_ABORTED, k)


def test_an_epoch_proposed_again_gets_its_own_grace_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An aborted epoch's number comes back with a later boundary. The time this pod's
    processes waited at the aborted attempt's boundary must not count against the new one:
    a sidecar that kept it aborted every later attempt of that number the moment a process
    reached its boundary (the agreement test under load: one number aborted again and again,
    no table committed after a sidecar restart)."""
    env = Env(tmp_path, ("pod0", "pod1"), monkeypatch)
    env.advance(10)
    slot = shm.PROCS_OFF + 5 * shm.PROC_SLOT_SIZE  # another rank process of this pod
    shm._Word(env.shm._buf, slot).store(os.getppid())
    assert env.coord.publish(TABLE) == 1
    p = env.participant("pod0", expected=2)
    p.step()  # yes; pod1's sidecar is dead
    k1 = env.shm.entry(1)[1]
    shm._Word(env.shm._buf, slot + 8).store(k1)  # the other rank reaches K and waits
    env.now = 100.0
    p.step()
    env.now = 102.5
    p.step()
    assert env.status(1) == EpochStatus.ABORTED  # waited 2.5 s at k1
    assert env.coord.publish(TABLE) == 1  # the number is proposed again, past every report
    p.step()  # yes again
    rec, _ = load_record(env.cas)
    assert rec is not None
    assert rec.pending is not None
    k2 = rec.pending.boundary
    assert k2 > k1
    shm._Word(env.shm._buf, slot + 8).store(k2)  # the rank reaches the new boundary
    _aborts_after_grace(env, p, 200.0)  # its own grace period, from when the rank got there


def test_a_leftover_table_in_a_slot_of_no_epoch_is_replaced(env: Env) -> None:
    """A slot whose sequence word names no epoch holds nothing a process may use: the
    sidecar writes the epoch's own table over whatever bytes are there."""
    other = TABLE.model_copy(update={"version": 2})
    env.shm.write_table(1, shm_table.encode_table(other, 1))  # e.g. left over in a reused file
    env.advance(10)
    assert env.coord.publish(TABLE) == 1
    p = env.participant("pod0")
    p.step()
    assert env.status(1) == EpochStatus.COMMITTED
    assert env.shm.entry(1)[0] == shm.EPOCH_PENDING  # the table reaches the slot on commit
    p.step()
    assert env.shm.entry(1)[0] == shm.EPOCH_COMMITTED
    assert env.shm.read_table(1) == shm_table.encode_table(TABLE, 1)


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
        p = Pod(Participant(cas, tables, f, "pod0", expected_procs=0), Coordinator(cas, tables))
        p.step()
        p.step()
        rec, _ = load_record(cas)
        assert rec is not None
        assert rec.epochs[0].status == EpochStatus.ABORTED
        assert f.entry(1) == (shm.EPOCH_NONE, 0)
        # committed where other pods' files could express it (this pod would have voted no)
        update_record(cas, lambda r: propose(r, TABLE.version, TABLE.digest, lead=3))  # K = 384
        update_record(cas, lambda r: resolve(vote(r, "pod0", 1, True)))
        update_record(cas, lambda r: propose(r, TABLE.version, TABLE.digest, lead=1))  # K = 512
        p.step()
        rec, _ = load_record(cas)
        assert rec is not None
        assert rec.epochs[1].status == EpochStatus.ABORTED  # blocked behind epoch 1
        assert f.entry(1) == (shm.EPOCH_NONE, 0)
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
    caplog.set_level(logging.INFO, logger="dynamiccl.sidecar.participant")
    p = env.participant("pod0", expected=4)  # this test process is the only one registered
    for e in range(1, WARN_AFTER_NO_VOTES + 1):
        assert env.coord.publish(TABLE.model_copy(update={"version": e})) == 1  # tried again
        p.step()
        assert env.status(1) == EpochStatus.ABORTED
    rec, _ = load_record(env.cas)
    assert rec is not None
    assert rec.epochs[0].reason.startswith("voted no: pod0: 1 of the 4 NCCL processes")
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "1 of the 4 NCCL processes" in infos[0]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "voted no on 3 epochs in a row" in warned[0]
    assert "1 of the 4 NCCL processes" in warned[0]


def test_an_aborted_reuse_gives_the_slot_back_with_its_table(env: Env, tmp_path: Path) -> None:
    """Epoch 64 takes epoch 1's slot and aborts: the slot goes back to epoch 1 with the table
    it held, without asking the table store (Kubernetes' keeps the last 8 versions only,
    dynamiccl/api/sidecar_objects.py), and a communicator created afterwards replays epoch 1
    from its boundary, as every other rank of a communicator created before did."""
    for v in range(1, KEPT_EPOCHS + 1):
        assert env.commit(v), v
    k1 = env.shm.entry(1)[1]
    assert env.coord.publish(table(KEPT_EPOCHS + 1)) == KEPT_EPOCHS + 1
    env.participant("pod0", expected=2).step()  # takes the slot, votes no: a rank is missing
    assert env.status(KEPT_EPOCHS + 1) == EpochStatus.ABORTED
    assert env.shm.slot(1)[0] == KEPT_EPOCHS + 1  # the reuse had taken the slot
    shutil.rmtree(tmp_path / "tables")  # the store has moved on
    (tmp_path / "tables").mkdir()
    env.participant("pod0").step()
    assert env.shm.slot(1) == (1, shm.EPOCH_COMMITTED, k1)
    assert shm_table.validate_table(env.shm.read_table(1), 1) == 0
    late = Comm(env.plugin, 6, 8, 1, comm_id=7)
    chans = [late.get_coll_info(4, 4096, env.cost).nchannels for _ in range(k1 + 3)]
    assert set(chans[:k1]) == {0}
    assert set(chans[k1:]) == {1}  # epoch 1's table


class _Unreadable:
    """A ballot object the API server refuses to read (403 before the operator granted it)."""

    def put(self, key: str, value: str) -> None:
        raise PermissionError("forbidden")

    def items(self) -> dict[str, str]:
        raise PermissionError("forbidden")


def test_a_sidecar_whose_ballot_cannot_be_read_starts_without_it(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """Starting must not fail on the ballot read-back (the sidecar would crash-loop); its
    first vote is then cast afresh, after the slot is taken, as for a new pod."""
    with caplog.at_level(logging.WARNING, logger="dynamiccl.sidecar.participant"):
        p = Participant(env.cas, env.tables, env.shm, "pod0", 1, ballots=BallotBox([_Unreadable()]))
    assert p.ballot == Ballot()
    assert "cannot read this pod's ballot" in caplog.text

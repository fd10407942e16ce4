"""Sidecars agreeing on tables through the epoch record (file CAS, real shared-memory files)."""

from __future__ import annotations

import os
import random
import struct
import threading
from pathlib import Path

import pytest

from dynamiccl.api.epoch import EpochStatus
from dynamiccl.api.table import DecisionTable
from dynamiccl.policy.online.tuner import TunerConfig
from dynamiccl.sidecar import shm, shm_table
from dynamiccl.sidecar.baseline import NcclDefaults
from dynamiccl.sidecar.cas import FileCAS, load_record
from dynamiccl.sidecar.explore_budget import BudgetedTuning
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.proposer import DirTableStore
from dynamiccl.sidecar.table_changes import RATE_WINDOW_S, Backends, Coordination, Settings
from dynamiccl.sidecar.tuning import Tuning
from tests.unit.sidecar.conftest import learned_table

L = 256


class Pod:
    """One pod: its shared-memory file (with one fake process) and its sidecar's coordination."""

    def __init__(
        self,
        root: Path,
        name: str,
        now: list[float],
        table: DecisionTable,
        voters: int,
        *,
        settings: Settings | None = None,
    ) -> None:
        self.now = now  # the fake clock, shared by the pods of a test
        self.path = root / f"{name}.shm"
        shm.create(self.path, L)
        self.file = shm.ShmFile(self.path)
        self.tuning = Tuning(table, TunerConfig(epoch_calls=8), NcclDefaults(None))
        b = Backends(
            FileCAS(root / "record.json"),
            FileCAS(root / "lease.json"),
            DirTableStore(root / "tables"),
        )
        self.coord = Coordination(
            b,
            self.file,
            name,
            voters,
            1,
            table,
            self.tuning,
            threading.Lock(),
            AgentMetrics(),
            settings or Settings(min_interval_s=30, retry_s=5, min_lead=2, abort_after_s=100),
            clock=lambda: now[0],
        )

    def process_at(self, boundary: int) -> None:
        """The pod's one training process registered and crossed `boundary`."""
        with self.path.open("r+b") as f:
            f.seek(shm.PROCS_OFF)
            f.write(struct.pack("<QQ", os.getpid(), boundary))


@pytest.fixture
def pods(tmp_path: Path) -> list[Pod]:
    now = [0.0]
    table = learned_table()
    return [Pod(tmp_path, n, now, table, 2) for n in ("a", "b")]


STEP_S = 0.4  # the fake clock's advance per round of sidecar steps


def step(pods: list[Pod], n: int = 1) -> None:
    """`n` rounds: every sidecar steps once, then the clock advances by STEP_S.

    A leader proposes only after watching the progress for RATE_WINDOW_S
    (1 s), i.e. from the fourth round on.
    """
    for _ in range(n):
        for p in pods:
            p.coord.step()
        pods[0].now[0] += STEP_S


def record(p: Pod) -> object:
    rec, _ = load_record(p.coord.b.record)
    assert rec is not None
    return rec


def test_initial_table_commits_once_every_pod_runs(pods: list[Pod]) -> None:
    a, b = pods
    step(pods, 2)  # b's ballot is in after round 1; the leader folds it in at round 2
    rec = record(a)
    assert rec.voters == ("a", "b")  # type: ignore[attr-defined]
    assert [p.coord.leader for p in pods].count(True) == 1
    assert rec.epochs == ()  # type: ignore[attr-defined]  # nobody's processes run yet
    a.process_at(L)
    step(pods)
    assert record(a).epochs == ()  # type: ignore[attr-defined]  # b's have not reached L
    b.process_at(2 * L)
    step(pods, 6)  # b reports; after 1 s of both running a proposes, both vote and mirror
    (ep,) = record(a).epochs  # type: ignore[attr-defined]
    assert ep.status == EpochStatus.COMMITTED
    assert ep.table_version == 1
    assert ep.boundary % L == 0
    assert ep.boundary >= 2 * L + 2 * L  # ahead of the fastest process by the lead
    for p in pods:
        assert p.file.entry(1) == (shm.EPOCH_COMMITTED, ep.boundary)
        assert shm_table.validate_table(p.file.read_table(1), 1) == 0
        assert p.coord.history.at(ep.boundary - 1) is None
        view = p.coord.history.at(ep.boundary)
        assert view is not None
        assert view.version == 1
    assert sum(len(p.coord.proposed) for p in pods) == 1


def test_nothing_is_proposed_before_the_call_rate_is_known(pods: list[Pod]) -> None:
    a, b = pods
    a.process_at(L)
    b.process_at(L)
    for _ in range(3):  # every pod runs and crossed L, but no time has passed: rate unknown
        for p in pods:
            p.coord.step()
    rec = record(a)
    assert rec.pending is None  # type: ignore[attr-defined]
    assert rec.epochs == ()  # type: ignore[attr-defined]
    a.now[0] += 1.0
    step(pods, 3)
    (ep,) = record(a).epochs  # type: ignore[attr-defined]
    assert ep.status == EpochStatus.COMMITTED


@pytest.mark.parametrize(("kube", "lead_s"), [(False, 0.5), (True, 5.0)])
def test_a_late_second_sidecar_still_gets_the_initial_table_early(
    tmp_path: Path, kube: bool, lead_s: float
) -> None:
    """Pod a's processes run for 3 s (10,000 calls/s) before pod b's sidecar joins.

    The initial table's boundary is set by the measured rate: `lead_s` of calls
    ahead of the fastest process (file coordination: 0.5 s), not the whole of a
    short run.
    """
    now = [0.0]
    settings = Settings.for_backend(kube)
    a = Pod(tmp_path, "a", now, learned_table(), 2, settings=settings)
    rate = 10_000
    calls = 0
    while now[0] < 3.0:
        now[0] += settings.step_s
        calls = int(rate * now[0])
        a.process_at(calls // L * L)
        a.coord.step()
    b = Pod(tmp_path, "b", now, learned_table(), 2, settings=settings)
    joined = now[0]
    b.process_at(L)
    while not record(a).epochs and now[0] < joined + 3.0:  # type: ignore[attr-defined]
        now[0] += settings.step_s
        calls = int(rate * now[0])
        a.process_at(calls // L * L)
        for p in (a, b):
            p.coord.step()
    # the rate counts from when both pods run: the proposal comes RATE_WINDOW_S later
    assert joined + RATE_WINDOW_S <= now[0] <= joined + RATE_WINDOW_S + 3 * settings.step_s
    (ep, *_) = record(a).epochs  # type: ignore[attr-defined]
    assert ep.table_version == 1
    ahead = ep.boundary - calls
    assert ahead > 0
    assert ahead <= rate * lead_s + 2 * L, (ahead, rate * lead_s)


@pytest.mark.parametrize("rounds", [False, True], ids=["fold-per-epoch", "fold-per-round"])
def test_the_tuners_table_follows_after_the_minimum_interval(pods: list[Pod], rounds: bool) -> None:
    """With rounds (the sidecar's setting) the tuner has folded nothing before the proposer
    may publish: the proposer ends the round, and the table carries what it learned."""
    a, b = pods
    for p in pods:
        p.tuning.rounds = rounds
    a.process_at(L)
    b.process_at(L)
    step(pods, 3)
    leader = next(p for p in pods if p.coord.leader)
    rng = random.Random(1)
    times = {(1, 1, 0, 0): 30.0, (1, 2, 0, 0): 20.0, (0, 2, 0, 0): 40.0}
    sc = leader.coord.base.scales[0]  # type: ignore[union-attr]
    for _ in range(200):
        arm = rng.choice(list(times))
        leader.tuning.observe(sc, 4, 20, 8, 2, arm, times[arm] * rng.lognormvariate(0, 0.02))
    assert rounds == any(ct.since_epoch == 200 for ct in leader.tuning.cells.values())
    step(pods, 2)
    assert len(record(a).epochs) == 1  # type: ignore[attr-defined]  # too soon
    a.now[0] += 31
    step(pods, 3)
    eps = record(a).epochs  # type: ignore[attr-defined]
    assert [e.status for e in eps] == [EpochStatus.COMMITTED] * 2
    assert eps[1].table_version == 2
    assert eps[1].boundary > eps[0].boundary
    latest = a.coord.history.latest
    assert latest is not None
    cell = latest.table.cell(latest.table.cells[0].collective, 20, sc)
    assert cell is not None
    assert (cell.choices[0].algo.value, cell.choices[0].proto.value) == ("ring", "simple")
    a.now[0] += 31
    step(pods, 2)
    assert len(record(a).epochs) == 2  # type: ignore[attr-defined]  # nothing new learned
    # a restarted leader has learned nothing yet: it proposes nothing
    fresh = Tuning(leader.coord.base, TunerConfig(epoch_calls=8), NcclDefaults(None))
    fresh.rounds = rounds
    leader.coord.tuning = fresh
    leader.coord._proposed_sig = None
    a.now[0] += 31
    step(pods, 2)
    assert len(record(a).epochs) == 2  # type: ignore[attr-defined]


def test_every_sidecars_tuner_folds_once_per_round(pods: list[Pod]) -> None:
    """Rounds (the sidecar's setting): the leader's and the other sidecar's tuners fold at
    most once per minimum interval, each with what its own pod measured."""
    a = pods[0]
    for p in pods:
        p.tuning.rounds = True
        p.process_at(L)
    step(pods, 3)
    rng = random.Random(2)
    sc = a.coord.base.scales[0]  # type: ignore[union-attr]
    for p in pods:
        for _ in range(40):
            arm = rng.choice([(1, 1, 0, 0), (1, 2, 0, 0)])
            p.tuning.observe(sc, 4, 20, 8, 2, arm, 20.0 * rng.lognormvariate(0, 0.02))
    epochs = [[ct.tuner.epoch for ct in p.tuning.cells.values()] for p in pods]
    a.now[0] += 31
    step(pods, 1)
    after = [[ct.tuner.epoch for ct in p.tuning.cells.values()] for p in pods]
    assert [[e + 1 for e in x] for x in epochs] == after  # both folded, once
    for p in pods:  # 40 more calls within the same interval: no second fold
        for _ in range(40):
            p.tuning.observe(sc, 4, 20, 8, 2, (1, 2, 0, 0), 20.0)
    step(pods, 3)
    assert [[ct.tuner.epoch for ct in p.tuning.cells.values()] for p in pods] == after


def test_a_process_past_the_boundary_aborts_and_the_retry_backs_off(pods: list[Pod]) -> None:
    a, b = pods
    a.process_at(L)
    b.process_at(L)
    a.coord.step()  # creates the record, takes the lease; b has not joined: nothing proposed
    b.coord.step()  # joins
    assert a.coord.leader
    assert record(a).epochs == ()  # type: ignore[attr-defined]
    a.now[0] += 1.0  # a has watched the progress long enough to know the call rate
    a.coord.step()  # proposes and votes yes
    pending = record(a).pending  # type: ignore[attr-defined]
    assert pending is not None
    assert a.coord.participant.voted(pending) is True  # in a's ballot, not in the record
    assert b.coord.participant.voted(pending) is None
    b.process_at(pending.boundary + L)  # b's process raced past K before b's sidecar voted
    step(pods, 2)
    (ep,) = record(a).epochs  # type: ignore[attr-defined]
    assert ep.status == EpochStatus.ABORTED
    assert ep.votes == {"b": False}  # the record keeps who said no
    assert ep.reason.startswith("voted no: b: a process is at call")
    for p in pods:
        assert p.file.entry(1)[0] == shm.EPOCH_ABORTED
        assert p.coord.history.latest is None
    step(pods, 3)
    assert len(record(a).epochs) == 1  # type: ignore[attr-defined]  # backing off
    a.now[0] += 6
    step(pods, 3)
    (retry,) = record(a).epochs  # type: ignore[attr-defined]  # the same number again
    assert retry.status == EpochStatus.COMMITTED
    assert (retry.epoch, retry.attempt) == (1, 2)
    assert retry.table_version == ep.table_version
    assert retry.boundary > pending.boundary + L


def test_a_late_sidecar_aborts_the_pending_epoch_and_joins(tmp_path: Path) -> None:
    now = [0.0]
    table = learned_table()
    a = Pod(tmp_path, "a", now, table, 1)
    a.process_at(L)
    a.coord.step()
    now[0] += 1.0  # the call rate is known
    a.coord.step()
    rec = record(a)
    assert rec.pending is not None or rec.epochs  # type: ignore[attr-defined]
    # a new pod appears while an epoch may be pending
    c = Pod(tmp_path, "c", now, table, 2)
    c.coord.participant.abort_after_s = 100
    pending_before = record(a).pending  # type: ignore[attr-defined]
    c.coord.step()  # its ballot
    a.coord.step()  # the leader folds it in
    rec = record(a)
    assert rec.voters == ("a", "c")  # type: ignore[attr-defined]
    if pending_before is not None:
        assert rec.epochs[pending_before.epoch - 1].status != EpochStatus.PENDING  # type: ignore[attr-defined]


def test_the_budgets_gate_decides_the_tables_exploration_without_waiting_a_round(
    tmp_path: Path,
) -> None:
    """The budget's gate starts closed: the first table explores nothing. When the job has
    earned the cost of exploring, its table with exploration goes out at once, not after
    `min_interval_s` (a round), and so does the table that closes it again. Before this, the
    first table explored whatever the gate said, and the closing table waited 30 s: a 4.5 s
    job explored at the table's rate throughout (2.72 % of its time against a 1 % budget)."""
    now, table = [0.0], learned_table()
    assert any(c.candidates and c.explore > 0 for c in table.cells)
    pods = [Pod(tmp_path, n, now, table, 2) for n in ("a", "b")]
    for p in pods:
        p.tuning = BudgetedTuning(table, TunerConfig(epoch_calls=8), NcclDefaults(None))
        p.coord.tuning = p.tuning
    a, b = pods
    a.process_at(L)
    b.process_at(L)
    step(pods, 6)
    leader = next(p for p in pods if p.coord.leader)
    guard = leader.tuning.guard  # type: ignore[attr-defined]

    def latest_explores() -> bool:
        view = a.coord.history.latest
        assert view is not None
        return any(c.candidates and c.explore > 0 for c in view.table.cells)

    assert len(record(a).epochs) == 1  # type: ignore[attr-defined]
    assert not latest_explores()  # the gate is closed: nothing earned yet
    cell = (4, 20, 8, 2)
    for _ in range(8000):  # 1 % of these calls' time covers a window of exploration
        guard.observe(cell, "table", 10.0)
    assert not guard.exhausted
    step(pods, 3)  # well within min_interval_s (30 s)
    eps = record(a).epochs  # type: ignore[attr-defined]
    assert [e.status for e in eps] == [EpochStatus.COMMITTED] * 2
    assert latest_explores()  # the job's own table, with its exploration
    for _ in range(4):  # exploratory calls far slower than the cell's: the credit is spent
        guard.observe(cell, "explore", 1000.0)
    assert guard.exhausted
    step(pods, 3)
    assert len(record(a).epochs) == 3  # type: ignore[attr-defined]
    assert not latest_explores()
    assert now[0] < 30  # every table went out within one round

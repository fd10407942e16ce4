"""Cutting reward batches (sidecar/cut.py): when a cut is due, and the batches it writes.

The sidecar's own parts (aggregates, baseline, tuner, step watch, spool, pace,
from a loaded configuration), on a stand-in clock the test advances.
"""

from __future__ import annotations

from pathlib import Path

from dynamiccl.api.rewards import MAX_RECORDS_PER_BATCH, RewardBatch
from dynamiccl.sidecar.aggregate import Aggregator, Key
from dynamiccl.sidecar.config import load
from dynamiccl.sidecar.cut import MAX_OUTBOX, Cutter
from dynamiccl.sidecar.explore_budget import BudgetGuard
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.pace import Pace
from dynamiccl.sidecar.shapes import sidecar_tuning
from dynamiccl.sidecar.spool import Spool
from dynamiccl.sidecar.step_judge import StepJudge
from dynamiccl.sidecar.step_watch import StepWatch
from tests.unit.sidecar.conftest import ConfigDir

FLUSH_S = 2.0


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


class Parts:
    """A Cutter and what it cuts from and into."""

    def __init__(self, config_dir: ConfigDir, tmp_path: Path) -> None:
        env = {
            "DYNAMICCL_POD_NAME": "llm-worker-0",
            "DYNAMICCL_POD_UID": "pod-uid-0",
            "DYNAMICCL_SHM_PATH": str(tmp_path / "shm" / "dynamiccl.shm"),
        }
        cfg = load(config_dir(), env)
        baseline, tuning = sidecar_tuning(cfg, BudgetGuard())
        self.clock = Clock()
        self.spool = Spool(tmp_path / "state", cfg.pod_uid)
        self.state = self.spool.load()
        self.agg = Aggregator()
        self.persisted: list[int] = []  # next_seq at each persist
        self.cutter = Cutter(
            cfg,
            agg=self.agg,
            baseline=baseline,
            tuning=tuning,
            steps=StepWatch(StepJudge(tuning.vetoes)),
            spool=self.spool,
            state=self.state,
            metrics=AgentMetrics(),
            pace=Pace(FLUSH_S, 1),
            persist=lambda: self.persisted.append(self.state.next_seq),
            clock=self.clock,
        )

    def add(self, version: int, n: int = 1) -> None:
        for bucket in range(n):
            key = Key(version, 4, bucket % 40, 8, 2, 1, 2, 0, 0, "default", bucket // 40)
            assert self.agg.add(key, 1 << 20, 50.0)

    def batches(self) -> list[RewardBatch]:
        out = []
        for seq in self.spool.outbox():
            body = self.spool.read_batch(seq)
            assert body is not None
            out.append(RewardBatch.model_validate_json(body))
        return out


def test_a_cut_is_due_every_interval_and_restarts_it(config_dir: ConfigDir, tmp_path: Path) -> None:
    p = Parts(config_dir, tmp_path)
    p.add(1)
    assert not p.cutter.due()
    p.clock.now += FLUSH_S - 0.01
    assert not p.cutter.due()
    p.clock.now += 0.01
    assert p.cutter.due()
    assert not p.cutter.due()  # the interval starts again at the due cut
    assert p.cutter.due(force=True)


def test_a_full_batch_is_due_at_once(config_dir: ConfigDir, tmp_path: Path) -> None:
    p = Parts(config_dir, tmp_path)
    p.add(1, MAX_RECORDS_PER_BATCH - 1)
    assert not p.cutter.due()
    p.add(2)
    assert p.cutter.due()


def test_a_full_outbox_pauses_cuts_but_not_a_forced_one(
    config_dir: ConfigDir, tmp_path: Path
) -> None:
    p = Parts(config_dir, tmp_path)
    p.add(1)
    for seq in range(1, MAX_OUTBOX + 1):
        p.spool.put_batch(seq, b"{}")  # the endpoint is behind
    p.clock.now += FLUSH_S
    assert not p.cutter.due()
    assert p.cutter.due(force=True)
    p.spool.reject(1, "gone")  # one batch leaves the outbox
    p.clock.now += FLUSH_S
    assert p.cutter.due()


def test_one_batch_per_version_each_saved_after_it_is_written(
    config_dir: ConfigDir, tmp_path: Path
) -> None:
    p = Parts(config_dir, tmp_path)
    p.add(1, 3)
    p.add(2, MAX_RECORDS_PER_BATCH + 1)  # two batches: one full, one with the record left
    assert p.cutter.write(5, leader=False) == 3
    got = p.batches()
    assert p.spool.outbox() == [1, 2, 3]
    assert [(b.table_version, len(b.records)) for b in got] == [
        (1, 3),
        (2, MAX_RECORDS_PER_BATCH),
        (2, 1),
    ]
    assert p.persisted == [2, 3, 4]  # the state saved after each batch, its sequence taken
    assert len(p.agg) == 0
    assert p.cutter.write(5, leader=False) == 0  # nothing open, nothing for a follower

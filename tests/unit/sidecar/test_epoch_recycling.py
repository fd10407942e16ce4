"""A job never runs out of table changes: epochs reuse table slots (issue 31.3).

What is real: the sidecar (`Runner`: coordination with the coordinator, the participant
and the epoch record in file CAS stores, ring drain, attribution, `StaticTuning`'s
guardrail), the shared-memory file and the plugin `.so`, played by this test process as
one rank (dynamiccl/testing/nccl_player.py; `Comm.repeat` is its fast path: many calls, one
cost table).
Stand-ins: the clock (tests/unit/sidecar/test_static_guard.py `sidecar`), execution times
(`_time` there: the static choice tree / LL takes 1.5x NCCL's ring / simple), and
`Alarms`, in place of the online tuner's change detector: each alarm changes the
tuner's signature, so the leader proposes a new table, as the tuner does when a CUSUM
alarm re-opens a cell's exploration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.api.epoch import KEPT_EPOCHS, EpochStatus
from dynamiccl.api.nccl import Algo, Proto
from dynamiccl.api.table import DecisionTable
from dynamiccl.sidecar.cas import load_record
from dynamiccl.sidecar.runner import Runner
from dynamiccl.sidecar.static_guard import StaticTuning
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, default_so, play
from tests.unit.sidecar.conftest import ConfigDir
from tests.unit.sidecar.test_static_guard import (
    LL,
    RING,
    SIMPLE,
    TREE,
    _cost,
    _time,
    sidecar,
    static_config,
    static_table,
)

L = 256
BUCKET = 20
NBYTES = 1 << BUCKET
COST = _cost(4, NBYTES)


class Alarms:
    """Stand-in for the online tuner's change detector (module docstring): the sidecar's
    own tuning, plus a count of alarms in its signature."""

    def __init__(self, inner: StaticTuning) -> None:
        self.inner = inner
        self.count = 0

    def end_round(self) -> None:
        self.inner.end_round()

    def signature(self) -> tuple[object, ...]:
        inner = self.inner.signature()
        return (self.count, *inner) if self.count else inner

    def table(self, version: int) -> DecisionTable | None:
        return self.inner.table(version)


class Job:
    """One rank through a private copy of the plugin, and its sidecar."""

    def __init__(self, runner: Runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("DYNAMICCL_SHM_PATH", str(runner.cfg.shm_path))
        so = tmp_path / "rank.so"
        so.write_bytes(default_so().read_bytes())
        self.plugin = Plugin(so)
        self.comm = Comm(self.plugin, 5, 8, 2, comm_id=0x5EED)
        self.prof = ProfiledComm(self.plugin, 5, 8, 2, comm_id=0x5EED)
        self.runner = runner
        assert runner.coordination is not None
        self.coord = runner.coordination
        assert isinstance(runner.tuning, StaticTuning)
        self.alarms = Alarms(runner.tuning)
        self.coord.tuning = self.alarms  # type: ignore[assignment]
        self.calls = 0

    def steps(self, n: int) -> list[tuple[int, int, int]]:
        """n training steps of one all-reduce each, unmeasured (the fast path)."""
        self.calls += n
        return self.comm.repeat(4, NBYTES, COST, n)

    def measured(self, n: int) -> list[tuple[int, int]]:
        """n steps with the profiler's records, drained by the sidecar."""
        out = play(self.comm, [(4, NBYTES)] * n, _time, profiler=self.prof, cost_fn=_cost)
        self.calls += n
        self.runner.drain_once()
        return [(p.algo, p.proto) for p in out]

    def epochs(self) -> list[int]:
        """The committed epochs the job's record keeps."""
        rec, _ = load_record(self.coord.b.record)
        assert rec is not None
        return [e.epoch for e in rec.epochs if e.status == EpochStatus.COMMITTED]

    def needs(self) -> list[int]:
        return [v for p in self.runner.shm.procs() for v in p.needs if v]


def _start(job: Job) -> None:
    """Until the job's first table is committed (and mirrored: this one thread plays the rank
    and the sidecar, so a rank must never reach a boundary still pending in its file)."""
    for _ in range(40):
        job.steps(L)
        job.coord.step()
        if job.epochs():
            job.coord.step()
            return
    raise AssertionError("the first table was never committed")


def _change(job: Job) -> None:
    """An alarm: the leader proposes its table, the vote commits it, the file shows it."""
    job.coord.step()  # the sidecar reports the rank's progress first
    job.alarms.count += 1
    job.coord.step()
    job.coord.step()


@pytest.mark.slow
def test_a_million_steps_and_500_alarms_later_a_bad_table_is_still_reverted(
    config_dir: ConfigDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NCCL's own pick as the table's choice: nothing to compare while the alarms come
    good = static_table(buckets=(BUCKET,), choice=(Algo.RING, Proto.SIMPLE))
    job = Job(
        sidecar(static_config(config_dir, tmp_path, good), tmp_path, 4), tmp_path, monkeypatch
    )
    _start(job)
    for _ in range(500):  # 10^6 steps, an alarm every 2000
        job.steps(2000)
        _change(job)
    job.steps(L * 8)
    job.coord.step()
    assert job.calls >= 1_000_000
    latest = job.epochs()[-1]
    assert latest == 501  # the first table and one per alarm: every one committed
    assert job.needs() == [latest]  # and taken into effect by the rank
    assert len(job.epochs()) == KEPT_EPOCHS  # the record keeps what the slots hold
    # the bad table (tree / LL, 1.5x slower than NCCL's pick) arrives as change 502
    bad = StaticTuning(
        static_table(buckets=(BUCKET,)), job.runner.cfg.tuner(), job.runner.baseline.defaults
    )
    job.runner.tuning = job.alarms.inner = bad
    _change(job)
    ran: list[tuple[int, int]] = []
    for _ in range(60):
        ran += job.measured(L)
        job.coord.step()
        job.coord.step()
    assert bad.reverted()  # the guardrail tripped
    assert job.epochs()[-1] == 503  # and its revert is an epoch that committed
    slow = [i for i, x in enumerate(ran) if x == (TREE, LL)]
    assert slow  # the bad table was in effect
    after = ran[slow[-1] + 1 :]
    assert len(after) > 10 * L
    assert set(after) == {(RING, SIMPLE)}  # NCCL's own choice from the revert on
    print(
        f"long job: {job.calls} calls, epochs 1..{job.epochs()[-1]} committed, the record and"
        f" the slots keep {len(job.epochs())}; bad table in effect for {slow[-1] - slow[0] + 1}"
        f" calls (first slow call {slow[0]} of {len(ran)} measured), then NCCL's choice"
    )


def test_a_communicator_created_after_slots_were_reused_ends_on_the_current_table(
    config_dir: ConfigDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 table changes (slots reused three times), then a new communicator: it skips the
    epochs that left the slots (NCCL's choice), replays the 63 kept ones from their
    boundaries, and from the latest boundary on runs exactly what the old one runs."""
    good = static_table(buckets=(BUCKET,), choice=(Algo.RING, Proto.SIMPLE))
    job = Job(
        sidecar(static_config(config_dir, tmp_path, good), tmp_path, 4), tmp_path, monkeypatch
    )
    _start(job)
    tables = [good, static_table(buckets=(BUCKET,), choice=(Algo.RING, Proto.LL))]
    for i in range(199):  # alternate two tables: each change is visible in the decisions
        job.alarms.inner = StaticTuning(
            tables[i % 2], job.runner.cfg.tuner(), job.runner.baseline.defaults
        )
        job.steps(L * 8)
        _change(job)
    job.steps(L * 8)
    job.coord.step()
    kept = job.epochs()
    assert kept[-1] == 200
    assert len(kept) == KEPT_EPOCHS
    first_k, *_, last_k = job.coord.history.boundaries  # the kept window's first and last
    old = job.steps(L)
    late = Comm(job.plugin, 5, 8, 2, comm_id=0x1A7E)
    replay = late.repeat(4, NBYTES, COST, last_k + 4 * L)
    # the retired epochs are skipped: NCCL's own choice until the kept window begins
    assert set(replay[:first_k]) == {(RING, SIMPLE, 0)}
    # the kept window is replayed: both tables appear, each from a kept boundary
    assert {(a, p) for a, p, _ in replay[first_k:last_k]} == {(RING, SIMPLE), (RING, LL)}
    # and it ends on the current table: exactly what the long-running communicator runs
    assert set(replay[last_k:]) == set(old)
    assert set(old) == {(RING, SIMPLE, 0)}  # table 200 is `good` (i = 198 took tables[0])

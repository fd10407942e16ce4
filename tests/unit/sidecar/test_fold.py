"""Folding ring blocks (sidecar/fold.py): what each record counts in, and what is skipped.

The sidecar's own parts (aggregates, NCCL baseline, tuner, exploration budget,
step watch, from `sidecar_tuning` of a loaded configuration); the shared memory
file's communicator registry is the one stand-in (`Comms`: a dict the test fills,
as the plugin's registration would).
"""

from __future__ import annotations

from collections import Counter as Tally
from pathlib import Path

from dynamiccl.sidecar.aggregate import Aggregator, Key
from dynamiccl.sidecar.attribution import DEFAULT, History
from dynamiccl.sidecar.config import load
from dynamiccl.sidecar.explore_budget import BudgetGuard
from dynamiccl.sidecar.fold import Fold
from dynamiccl.sidecar.ring import Columns
from dynamiccl.sidecar.shapes import sidecar_tuning
from dynamiccl.sidecar.step_judge import StepJudge
from dynamiccl.sidecar.step_watch import StepWatch
from tests.unit.sidecar.conftest import ConfigDir

COMM, NRANKS, NNODES = 0xC0FFEE, 8, 2
ALL_REDUCE, RING, SIMPLE = 4, 1, 2


class Comms:
    """The registry stand-in: what `ShmFile.comms()` would return, and how often it was read."""

    def __init__(self) -> None:
        self.registered: dict[int, tuple[int, int]] = {}
        self.reads = 0

    def comms(self) -> dict[int, tuple[int, int]]:
        self.reads += 1
        return dict(self.registered)


def fold_of(config_dir: ConfigDir, tmp_path: Path, registry: Comms) -> Fold:
    env = {
        "DYNAMICCL_POD_NAME": "llm-worker-0",
        "DYNAMICCL_POD_UID": "pod-uid-0",
        "DYNAMICCL_SHM_PATH": str(tmp_path / "shm" / "dynamiccl.shm"),
    }
    cfg = load(config_dir(), env)
    budget = BudgetGuard(cfg.exploration.exploration.budget_percent)
    baseline, tuning = sidecar_tuning(cfg, budget)
    steps = StepWatch(StepJudge(tuning.vetoes))
    return Fold(
        registry, agg=Aggregator(), baseline=baseline, tuning=tuning, budget=budget, steps=steps
    )


def block(*recs: tuple[int, int, int, int, int, int]) -> Columns:
    """Records (comm, nbytes, exec_ns, coll, algo, tag) on RING/SIMPLE, NCCL's channels."""
    n = len(recs)
    return Columns(
        comm_id=[r[0] for r in recs],
        nbytes=[r[1] for r in recs],
        exec_ns=[r[2] for r in recs],
        coll_seq=list(range(n)),
        coll=[r[3] for r in recs],
        algo=[r[4] for r in recs],
        proto=[SIMPLE] * n,
        nchannels=[0] * n,
        start_ns=[1000 * i for i in range(n)],
        user_tag=[r[5] for r in recs],
    )


def run(fold: Fold, cols: Columns) -> tuple[Tally[str], Tally[str]]:
    origins: Tally[str] = Tally()
    skipped: Tally[str] = Tally()
    fold.block(0, cols, History(), origins, skipped)
    return origins, skipped


def test_a_communicator_registered_later_is_folded_once_the_registry_shows_it(
    config_dir: ConfigDir, tmp_path: Path
) -> None:
    reg = Comms()
    fold = fold_of(config_dir, tmp_path, reg)
    rec = (COMM, 1 << 20, 50_000, ALL_REDUCE, RING, 0)
    origins, skipped = run(fold, block(rec))
    assert skipped == {"unregistered_communicator": 1}
    assert not origins
    assert len(fold.agg) == 0
    reg.registered[COMM] = (NRANKS, NNODES)  # the plugin registers the communicator
    origins, skipped = run(fold, block(rec, rec))
    assert origins == {DEFAULT: 2}
    assert not skipped
    assert reg.reads == 2  # re-read on the first miss only, then remembered
    [(key, stats)] = fold.agg.take(10)
    assert (key.coll, key.nranks, key.nnodes, key.origin) == (ALL_REDUCE, NRANKS, NNODES, DEFAULT)
    assert (key.algo, key.proto) == (RING, SIMPLE)
    assert stats.count == 2
    assert stats.sum_us == 100.0
    cell = (ALL_REDUCE, key.bucket, NRANKS, NNODES)
    assert fold.baseline.measured(cell) == 50.0  # NCCL's own pick: the baseline learned it


def test_unusable_records_are_skipped_and_count_nowhere(
    config_dir: ConfigDir, tmp_path: Path
) -> None:
    reg = Comms()
    reg.registered[COMM] = (NRANKS, NNODES)
    fold = fold_of(config_dir, tmp_path, reg)
    origins, skipped = run(
        fold,
        block(
            (COMM, 1 << 20, 50_000, 5, RING, 0),  # not a collective NCCL tunes
            (COMM, 1 << 20, 0, ALL_REDUCE, RING, 0),  # took no time
            (COMM, 1 << 20, 50_000, ALL_REDUCE, 7, 0),  # no such algorithm
        ),
    )
    assert skipped == {"unusable": 3}
    assert not origins
    assert len(fold.agg) == 0
    assert fold.baseline.to_state() == []


def test_each_tag_folds_into_its_own_aggregate(config_dir: ConfigDir, tmp_path: Path) -> None:
    reg = Comms()
    reg.registered[COMM] = (NRANKS, NNODES)
    fold = fold_of(config_dir, tmp_path, reg)
    origins, _ = run(
        fold,
        block(
            (COMM, 1 << 20, 40_000, ALL_REDUCE, RING, 0),
            (COMM, 1 << 20, 60_000, ALL_REDUCE, RING, 7),
            (COMM, 1 << 20, 80_000, ALL_REDUCE, RING, 7),
        ),
    )
    assert origins == {DEFAULT: 3}
    got: dict[int, tuple[Key, int]] = {k.user_tag: (k, s.count) for k, s in fold.agg.take(10)}
    assert sorted(got) == [0, 7]
    assert got[0][1] == 1
    assert got[7][1] == 2
    assert got[0][0]._replace(user_tag=7) == got[7][0]  # the same call otherwise


def test_a_refused_record_is_counted_as_refused(config_dir: ConfigDir, tmp_path: Path) -> None:
    reg = Comms()
    reg.registered[COMM] = (NRANKS, NNODES)
    fold = fold_of(config_dir, tmp_path, reg)
    fold.agg.max_keys = 1
    origins, skipped = run(
        fold,
        block(
            (COMM, 1 << 20, 40_000, ALL_REDUCE, RING, 0),
            (COMM, 1 << 20, 40_000, ALL_REDUCE, RING, 1),  # a second key: beyond max_keys
        ),
    )
    assert origins == {DEFAULT: 1}
    assert skipped == {"refused": 1}
    cell = (ALL_REDUCE, next(iter(fold.agg.items()))[0].bucket, NRANKS, NNODES)
    assert fold.baseline.measured(cell) == 40.0  # the refused call counted nowhere

"""The sidecar's hard exploration budget: measured cost, credit accrued with collective time,
exploration only while the credit covers a window of it, for jobs of any length."""

from __future__ import annotations

import random
from collections import deque

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Candidate, Cell, Choice, DecisionTable
from dynamiccl.policy.online.tuner import TunerConfig
from dynamiccl.sidecar.baseline import NcclDefaults
from dynamiccl.sidecar.explore_budget import BudgetedTuning, BudgetGuard

CELL = (4, 26, 16, 2)
OTHER = (4, 20, 16, 2)
WINDOW = 384  # the harness: a drain every 256 calls, then up to two epoch boundaries of 64


def play(calls: int, rate: float, slow: float, seed: int = 0, window: int = WINDOW) -> BudgetGuard:
    """A job as the plugin runs it: a call explores (at `rate`, `slow` x the cell's time) only
    while the table in effect lets it, and that table follows the gate `window` calls late."""
    rng = random.Random(seed)
    g = BudgetGuard(percent=1.0, window_calls=window, rate_prior=rate)  # the table's explore
    lag: deque[bool] = deque([False] * window, maxlen=window)
    for i in range(calls):
        in_effect = lag[0]
        cell = CELL if i % 2 else OTHER
        base = 1000.0 if cell == CELL else 100.0
        jitter = rng.lognormvariate(0.0, 0.03)
        if in_effect and rng.random() < rate:
            g.observe(cell, "explore", base * slow * jitter)
        else:
            g.observe(cell, "table", base * jitter)
        lag.append(g.is_open)
    return g


def test_cost_is_the_extra_time_of_exploratory_calls_over_the_cells_own_choice() -> None:
    g = BudgetGuard(percent=1.0)
    g.observe(CELL, "explore", 300.0)  # before any reference: charged once the cell has one
    assert g.cost_us == 0.0
    assert g.pending_calls == 1
    for _ in range(9):
        g.observe(CELL, "table", 100.0)
    assert (g.explore_calls, g.cost_us, g.charged_calls, g.pending_calls) == (1, 200.0, 1, 0)
    g.observe(CELL, "explore", 50.0)  # faster than the cell's choice: no cost, never a refund
    assert g.cost_us == 200.0


def test_no_credit_no_exploration_at_the_start() -> None:
    g = BudgetGuard(percent=1.0)
    assert g.exhausted
    for _ in range(100):
        g.observe(CELL, "table", 100.0)
    assert g.exhausted  # 100 calls earn 80 us; a window of exploration may cost far more


@pytest.mark.parametrize("calls", [300, 1_000, 3_000, 10_000, 30_000])
@pytest.mark.parametrize(
    ("rate", "slow"), [(1 / 128, 2.0), (1 / 128, 8.0), (1 / 32, 3.0), (1 / 4, 3.0)]
)
def test_the_budget_holds_for_jobs_of_any_length(calls: int, rate: float, slow: float) -> None:
    for seed in range(2):
        g = play(calls, rate, slow, seed)
        assert g.cost_percent <= 1.0, (calls, rate, slow, seed, g.summary())


def test_long_jobs_explore_as_their_credit_allows() -> None:
    cheap = play(100_000, 1 / 128, 2.0)  # costs ~0.45 % while open: never needs to close
    assert cheap.explore_calls > 300
    assert cheap.openings == 1
    assert cheap.stopped_at_call is None
    dear = play(100_000, 1 / 32, 3.0)  # ~7 x the budget while open: opens, closes, reopens
    assert dear.explore_calls > 50
    assert dear.openings > 1
    assert 0.3 < dear.cost_percent <= 1.0
    short = play(300, 1 / 4, 3.0)  # too short to earn a window's cost: never explores
    assert short.explore_calls == 0


def test_the_window_follows_the_sidecars_looks() -> None:
    """A sidecar whose looks at the rings read 4096 calls (a stop reaches the plugin ~8.7k calls
    late, not the default window's 1024) keeps the budget once it notes its drains; without
    them the same job spent ~2 % (measured)."""
    lag, drain = 2 * 4096 + 512, 4096
    for noted in (True, False):
        rng = random.Random(0)
        g = BudgetGuard(percent=1.0, rate_prior=1 / 128)
        late: deque[bool] = deque([False] * lag, maxlen=lag)
        for i in range(30_000):
            cell, base = (CELL, 1000.0) if i % 2 else (OTHER, 100.0)
            slow = 8.0 if late[0] and rng.random() < 1 / 128 else 1.0
            g.observe(cell, "explore" if slow > 1 else "table", base * slow)
            if noted and i % drain == drain - 1:
                g.note_drain(drain, 512)
            late.append(g.is_open)
        assert (g.cost_percent <= 1.0) is noted, g.summary()
    g.note_drain(10, 0)
    assert g.window_calls == 1024  # never shrinks below the default


def test_reopenings_are_few_whatever_the_job_length() -> None:
    g = play(300_000, 1 / 32, 3.0)
    assert g.openings <= 8  # each flip is an epoch; a job has 63


def test_a_closed_gate_proposes_a_table_without_exploration() -> None:
    cell = Cell(
        collective=Collective.ALLREDUCE,
        bucket=26,
        scale=5,
        choices=(Choice(algo=Algo.RING, proto=Proto.SIMPLE),),
        candidates=(Candidate(algo=Algo.TREE, proto=Proto.SIMPLE, weight=3),),
        explore=0.25,
    )
    bare = cell.model_copy(update={"choices": (), "bucket": 27})
    base = DecisionTable(version=1, scales=(5,), cells=(cell, bare))
    guard = BudgetGuard(percent=1.0, window_calls=4)
    tuning = BudgetedTuning(base, TunerConfig(), NcclDefaults(None), guard=guard)
    closed = tuning.signature()
    t = tuning.table(2)
    assert t is not None
    assert [(c.bucket, c.candidates, c.explore) for c in t.cells] == [(26, (), 0.0)]
    assert t.cells[0].choices == cell.choices
    for _ in range(2000):  # credit accrues with collective time
        guard.observe(CELL, "table", 100.0)
    assert guard.is_open
    assert tuning.signature() != closed  # the proposer publishes the new table
    t = tuning.table(3)
    assert t is not None
    assert t.cells[0].explore == 0.25
    for _ in range(10):
        guard.observe(CELL, "explore", 5000.0)
    assert guard.exhausted  # spent: closed again
    assert tuning.signature() == closed

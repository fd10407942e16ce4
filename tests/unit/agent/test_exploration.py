"""The sidecar's hard exploration budget: measured cost, one-way stop, no exploration after."""

from __future__ import annotations

from dynamiccl.agent.baseline import NcclDefaults
from dynamiccl.agent.exploration import BudgetedTuning, BudgetGuard
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Candidate, Cell, Choice, DecisionTable
from dynamiccl.policy.online.tuner import TunerConfig

CELL = (4, 26, 16, 2)


def test_cost_is_the_extra_time_of_exploratory_calls_over_the_cells_own_choice() -> None:
    g = BudgetGuard(percent=1.0, min_calls=10, horizon_calls=10)
    g.observe(CELL, "explore", 300.0)  # before any reference: charged later
    for _ in range(9):
        g.observe(CELL, "table", 100.0)
    assert g.explore_calls == 1
    assert g.cost_us == 200.0
    assert g.exhausted  # 200 us of 1200 us: far over 1 %
    assert g.stopped_at_call == 10
    for _ in range(100_000):
        g.observe(CELL, "table", 100.0)
    assert g.exhausted  # one-way
    assert g.summary()["exploration_cost_percent"] < 1.0


def test_cheap_exploration_stays_within_budget() -> None:
    g = BudgetGuard(percent=1.0)
    for i in range(100_000):
        slow = i % 128 == 0  # 1/128 of the calls explore a configuration 2x as slow
        g.observe(CELL, "explore" if slow else "default", 200.0 if slow else 100.0)
    assert not g.exhausted
    assert 0.7 < g.cost_percent < 0.8


def test_a_spent_budget_proposes_a_table_without_exploration() -> None:
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
    guard = BudgetGuard(percent=1.0, min_calls=1, horizon_calls=1)
    tuning = BudgetedTuning(base, TunerConfig(), NcclDefaults(None), guard=guard)
    before = tuning.signature()
    t = tuning.table(2)
    assert t is not None
    assert t.cells[0].explore == 0.25
    guard.observe(CELL, "explore", 500.0)
    guard.observe(CELL, "table", 100.0)
    assert guard.exhausted
    assert tuning.signature() != before  # the proposer publishes the new table
    t = tuning.table(3)
    assert t is not None
    assert [(c.bucket, c.candidates, c.explore) for c in t.cells] == [(26, (), 0.0)]
    assert t.cells[0].choices == cell.choices


def test_front_loaded_exploration_is_judged_against_the_horizon() -> None:
    g = BudgetGuard(percent=1.0)
    for i in range(2000):  # the first 2000 calls explore 1/64 of the time at 2x: 1.6 % so far
        slow = i % 64 == 0
        g.observe(CELL, "explore" if slow else "table", 200.0 if slow else 100.0)
    assert g.cost_percent > 1.0
    assert not g.exhausted  # 0.3 % of the 10 000-call horizon
    for _ in range(98_000):
        g.observe(CELL, "table", 100.0)
    assert g.cost_percent < 0.1

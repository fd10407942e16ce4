"""Cells seeded for communicator shapes no table covers (sidecar/shapes.py)."""

from __future__ import annotations

import math

from dynamiccl.api.nccl import Collective
from dynamiccl.api.table import MAX_SCALES, DecisionTable, scale_class
from dynamiccl.policy.online.tuner import TunerConfig
from dynamiccl.sidecar.attribution import arm_of
from dynamiccl.sidecar.explore_budget import BudgetGuard
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.shapes import ShapeDefaults, ShapeTuning, seed_cell
from tests.unit.sidecar.conftest import features, learned_table

DP = (2, 2)  # 2 ranks over the job's 2 nodes: no cell in learned_table(8, 2)
DP_SCALE = scale_class(*DP)


def tuning(table: DecisionTable | None = None, feats: bool = True) -> ShapeTuning:
    return ShapeTuning(
        table or learned_table(8, 2),
        TunerConfig(epoch_calls=16, budget_calls=200),
        ShapeDefaults(features() if feats else None),
        guard=BudgetGuard(),
        metrics=AgentMetrics(),
    )


def gauge(t: ShapeTuning, state: str) -> float:
    assert t.metrics is not None
    got = t.metrics.registry.get_sample_value("dynamiccl_sidecar_online_shapes", {"state": state})
    return got or 0.0


def test_candidates_are_nccls_next_best_by_its_model_of_the_shape() -> None:
    d = ShapeDefaults(features())
    model = d.model(*DP)
    assert model is not None
    pick = d.pick(4, 20, *DP)
    assert pick is not None
    cell = seed_cell(d, DP_SCALE, (4, 20, *DP), (pick[0], pick[1], 0, 0))
    assert cell is not None
    assert cell.choices == ()  # NCCL keeps deciding until a candidate is measured better
    t = model.times([4], [2.0**20.5])[0]
    ranked = sorted(
        (float(t[a, p]), (a, p, 0, 0))
        for a in range(t.shape[0])
        for p in range(t.shape[1])
        if math.isfinite(float(t[a, p])) and (a, p) != pick[:2]
    )
    assert [arm_of(c) for c in cell.candidates] == [arm for _, arm in ranked[:4]]
    weights = [c.weight for c in cell.candidates]
    assert weights == sorted(weights, reverse=True)


def test_without_a_model_nccl_is_what_it_was_seen_to_run() -> None:
    d = ShapeDefaults(None)
    shape = (2, 22, 6, 3)  # all-gather, 6 ranks over 3 nodes: no features, no model
    assert d.pick(*shape) is None
    d.note(shape, (6, 2, 0, 0), 40.0)  # NCCL ran PAT/SIMPLE
    assert d.pick(*shape) == (6, 2, 40.0)
    cell = seed_cell(d, scale_class(6, 3), shape, (6, 2, 0, 0))
    assert cell is not None
    assert (6, 2, 0, 0) not in [arm_of(c) for c in cell.candidates]
    assert [arm_of(c) for c in cell.candidates] == [(1, 2, 0, 0), (1, 1, 0, 0), (1, 0, 0, 0)]


def test_an_uncovered_scale_joins_the_table_and_its_pick_calls_spend_no_budget() -> None:
    t = tuning()
    before = t.signature()
    nccl = (1, 1, 0, 0)
    for _ in range(500):  # NCCL's own pick while no table carries the cell
        t.observe(DP_SCALE, 4, 20, *DP, nccl, 50.0)
    assert t.signature() != before  # something to propose: the seeded cell
    table = t.table(version=2)
    assert table is not None
    assert DP_SCALE in table.scales  # (its cells explore once the job's budget allows)
    assert t.base is not None
    cell = t.base.cell(Collective.ALLREDUCE, 20, DP_SCALE)
    assert cell is not None
    assert cell.candidates
    assert t.cells == {}  # no tuner yet: 500 calls of NCCL's pick opened no budget
    t.observe(DP_SCALE, 4, 20, *DP, arm_of(cell.candidates[0]), 40.0)  # the table is in effect
    (ct,) = t.cells.values()
    assert ct.calls == 1
    assert ct.tuner.exploring
    assert t.summary()["online_shapes"] == [[*DP, DP_SCALE]]
    assert gauge(t, "online") == 1
    # buckets the compiler leaves to NCCL stay NCCL's
    t.observe(DP_SCALE, 4, 39, *DP, nccl, 50.0)
    assert t.base.cell(Collective.ALLREDUCE, 39, DP_SCALE) is None


def test_a_full_table_leaves_the_shape_to_nccl_and_says_so() -> None:
    base = learned_table(8, 2)
    others = tuple(s for s in range(32) if s not in (*base.scales, DP_SCALE))
    full = base.model_copy(update={"scales": (*base.scales, *others)[:MAX_SCALES]})
    t = tuning(full)
    t.observe(DP_SCALE, 4, 20, *DP, (1, 1, 0, 0), 50.0)
    assert t.base is not None
    assert DP_SCALE not in t.base.scales
    assert t.summary()["untuned_shapes"] == [[*DP, DP_SCALE]]
    assert (gauge(t, "untuned"), gauge(t, "online")) == (1, 0)
    assert t.signature() == tuning(full).signature()


def test_without_learned_mode_nothing_is_seeded() -> None:
    t = ShapeTuning(
        learned_table(8, 2),
        TunerConfig(epoch_calls=16),
        ShapeDefaults(features()),
        enabled=False,
        guard=BudgetGuard(),
    )
    t.observe(DP_SCALE, 4, 20, *DP, (1, 1, 0, 0), 50.0)
    assert t.base == learned_table(8, 2)

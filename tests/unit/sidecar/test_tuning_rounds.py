"""The sidecar's tuner decides once per table round, whatever a round's call count.

Every call here runs what the published table decides (`api.table.decide`, the plugin's
rule), so what is measured is what the plugin would run: a plan reaches the calls only
through a table, one per round. A busy cell (hundreds of calls a round) must explore as
many calls per round as a quiet one and decide as well; before rounds, its tables
explored at the epoch's probability for the whole round.
"""

from __future__ import annotations

import random

from dynamiccl.api.nccl import Collective
from dynamiccl.api.table import DecisionTable, decide
from dynamiccl.policy.online.plan import Plan, round_plan
from dynamiccl.policy.online.tuner import TunerConfig
from dynamiccl.sidecar.attribution import arm_of
from dynamiccl.sidecar.tuning import Tuning
from tests.unit.sidecar.test_tuning import CID, NVLS, SC, FixedDefaults, base, ring_simple_at

BEST = (1, 2, 16, 0)  # RING/SIMPLE at 16 channels (ring_simple_at)


def job(round_calls: int, rounds: int, *, fold_per_round: bool = True) -> tuple[Tuning, list[int]]:
    """A job whose cell makes `round_calls` calls per table round; the calls per round that
    ran something other than the round's committed configuration."""
    cfg = TunerConfig(epoch_calls=16, budget_calls=400, refine=0.5)
    t = Tuning(base(), cfg, FixedDefaults(), channel_range=(1, 64), rounds=fold_per_round)
    time_of, rng = ring_simple_at(16), random.Random(3)
    table: DecisionTable = base()
    explored, j = [], 0
    for r in range(rounds):
        cell = table.cell(Collective.ALLREDUCE, 20, SC)
        assert cell is not None
        committed = arm_of(cell.choices[0]) if cell.choices else NVLS
        n = 0
        for _ in range(round_calls):
            c = decide(table, Collective.ALLREDUCE, 1 << 20, 8, 1, 0, j, lambda _c: True)
            arm = arm_of(c) if c is not None else NVLS
            n += arm != committed
            t.observe(SC, 4, 20, 8, 1, arm, time_of(arm) * rng.lognormvariate(0, 0.03))
            j += 1
        explored.append(n)
        t.end_round()  # the proposer may publish: the tuners plan the next round
        nxt = t.table(version=r + 2)
        assert nxt is not None
        table = nxt
    return t, explored


def test_a_busy_cell_explores_per_round_as_a_quiet_one_and_finds_the_best() -> None:
    quiet, q = job(16, 40)
    busy, b = job(512, 40)
    for t in (quiet, busy):
        ct = t.cells[CID]
        assert ct.arms[ct.tuner.chosen()] == BEST
        assert not ct.tuner.exploring  # the budget is spent within the rounds
    # the first round runs the base table (its own explore schedule); after it, the busy
    # cell explores about what the quiet one does: its plans are scaled to its rounds
    assert sum(b[1:]) <= 3 * sum(q[1:]), (q, b)
    # and it decides as fast, in rounds: exploration ends within a round or two of the quiet
    ends = [next(i for i, n in enumerate(x) if i and not any(x[i:])) for x in (q, b)]
    assert ends[1] <= ends[0] + 2, (q, b)


def test_without_rounds_a_busy_cell_spends_its_budget_in_one_round() -> None:
    """The control, folding every epoch_calls calls as before rounds: the busy cell's 400
    budget calls all fall in its first round, under the base table, whose plan the tuner
    cannot change; exploration ends with what that table tried, without the best."""
    t, b = job(512, 40, fold_per_round=False)
    ct = t.cells[CID]
    assert not ct.tuner.exploring
    assert sum(b[1:]) == 0  # nothing explored after the first round
    assert ct.arms[ct.tuner.chosen()] != BEST
    assert ct.tuner.stats[ct.arms.index(BEST)].n == 0  # never tried


def test_round_plan_scales_a_long_round_to_the_epochs_expected_looks() -> None:
    plan = Plan(committed=0, candidates=((1, 10), (2, 5)), explore=0.5)
    assert round_plan(plan, 16, 16) == plan  # a round of an epoch's calls: as planned
    assert round_plan(plan, 16, 4) == plan  # shorter rounds wait for the epoch's calls
    long = round_plan(plan, 16, 1600)
    assert long.candidates == plan.candidates
    assert abs(long.explore * 1600 - plan.explore * 16) < 1e-9  # the same expected looks
    tiny = round_plan(plan, 16, 10**9)
    assert tiny.eps_q16 == 1  # still explores, at the plugin's smallest probability
    idle = Plan(committed=0, candidates=(), explore=0.0)
    assert round_plan(idle, 16, 1600) == idle


def test_the_budget_counts_at_most_an_epoch_per_epoch() -> None:
    """A round longer than an epoch spends one epoch of the budget (budget_spent)."""
    from dynamiccl.policy.online.tuner import CellKey, cell_tuner  # noqa: PLC0415

    key = CellKey(1, 0, 8, 1, Collective.ALLREDUCE, 20)
    cfg = TunerConfig(epoch_calls=16, budget_calls=32)
    t = cell_tuner([(1, 2), (0, 2)], [None, None], [1.0, 0.5], 0, cfg=cfg, key=key)
    for _ in range(100):
        t.observe(0, 10.0)
    assert not t.budget_spent  # 100 calls in one epoch: 16 of the budget
    t.end_epoch()
    for _ in range(15):
        t.observe(0, 10.0)
    assert not t.budget_spent
    t.observe(1, 11.0)
    assert t.budget_spent


def test_the_sidecar_and_the_bench_scale_rounds_with_one_rule() -> None:
    """`bench tune`'s sidecar rows (`_run_rounds`) and the sidecar's tables (`Tuning._cell`)
    scale a round's plan with the same `plan.round_plan`, and fold with the same tuner."""
    from dynamiccl.policy.eval import bench_tune  # noqa: PLC0415
    from dynamiccl.policy.online import plan  # noqa: PLC0415
    from dynamiccl.sidecar import tuning as sidecar  # noqa: PLC0415

    assert getattr(sidecar, "round_plan") is plan.round_plan  # noqa: B009
    assert getattr(bench_tune, "round_plan") is plan.round_plan  # noqa: B009
    # a table round of the sidecar runs the plan `round_plan` gives for the last round's calls
    t, _ = job(512, 3)
    ct = t.cells[CID]
    cell = t.table(version=9).cell(Collective.ALLREDUCE, 20, SC)  # type: ignore[union-attr]
    assert cell is not None
    want = round_plan(ct.tuner.plan, 16, ct.round_calls)
    assert ct.round_calls == 512
    assert 0 < cell.eps_q16 == want.eps_q16 < ct.tuner.plan.eps_q16

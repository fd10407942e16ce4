"""The step judge's verdicts on table changes (sidecar/step_judge.py), on synthetic steps."""

from __future__ import annotations

import random

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable
from dynamiccl.sidecar.attribution import History, TableView
from dynamiccl.sidecar.step_judge import StepJudge, Vetoes, changed_cells
from dynamiccl.sidecar.steps import Step

CALLS = 24  # calls of the clock communicator per step
BOUNDS = (0, 10_000, 20_000, 30_000)  # call index of each table's first call


def table(version: int, nch: int | None) -> DecisionTable:
    choices = () if nch is None else (Choice(algo=Algo.TREE, proto=Proto.LL128, nchannels=nch),)
    cell = Cell(collective=Collective.ALLREDUCE, bucket=24, scale=3, choices=choices)
    return DecisionTable(version=version, scales=(3,), cells=(cell,))


CID = (3, Collective.ALLREDUCE.nccl_id, 24)


def history(*nch: int | None) -> History:
    return History(
        [(BOUNDS[i], TableView(table(i + 1, n))) for i, n in enumerate(nch)]  # versions 1..
    )


def after_nccl(nch: int | None) -> History:
    """NCCL's own choices up to BOUNDS[1] (version 0), then the job's initial table."""
    return History([(BOUNDS[1], TableView(table(1, nch)))])


def feed(  # noqa: PLR0917
    judge: StepJudge,
    h: History,
    table_index: int,
    step_us: float,
    n: int,
    sd: float = 0.003,
    calls: int = CALLS,
) -> None:
    rng = random.Random(table_index)
    seq = BOUNDS[table_index] + 5 * CALLS
    for _ in range(n):
        us = step_us * rng.gauss(1.0, sd)
        judge.add(Step(1, seq, 0, int(us * 1e3), calls), h)
        seq += calls


def test_a_change_that_slows_the_step_is_rejected_and_reverted() -> None:
    vetoes = Vetoes()
    judge = StepJudge(vetoes)
    h = history(8, 32)
    feed(judge, h, 0, 19_400, 20)
    feed(judge, h, 1, 20_800, 8)  # 7 % slower
    (v,) = judge.check()
    assert not v.kept
    assert (v.version, v.reference) == (2, 1)
    assert v.slowdown > 0.06
    arm32, arm8 = (0, 1, 32, 0), (0, 1, 8, 0)
    assert vetoes.is_bad(CID, arm32)
    assert vetoes.committed(CID, arm32, None) == arm8  # the next table puts 8 back
    assert vetoes.committed(CID, (0, 1, 12, 0), None) == (0, 1, 12, 0)  # others untouched


def test_a_slowdown_within_the_noise_waits_for_more_steps() -> None:
    judge = StepJudge(Vetoes())
    h = history(8, 12)
    feed(judge, h, 0, 19_400, 30, sd=0.02)
    feed(judge, h, 1, 19_400 * 1.015, 8, sd=0.02)  # 1.5 % slower under 2 % noise
    assert judge.check() == []  # beyond the margin, within the noise: more steps first
    feed(judge, h, 1, 19_400 * 1.015, 80, sd=0.02)
    (v,) = judge.check()
    assert not v.kept  # with enough steps the slowdown is beyond the noise


def test_a_change_slower_by_less_than_the_margin_stays() -> None:
    judge = StepJudge(Vetoes())
    h = history(8, 12)
    feed(judge, h, 0, 19_400, 30)
    feed(judge, h, 1, 19_400 * 1.004, 8)
    (v,) = judge.check()
    assert v.kept
    assert not judge.vetoes.bad


def test_a_faster_change_stays_and_the_revert_of_a_rejection_is_not_judged() -> None:
    judge = StepJudge(Vetoes())
    h = history(8, 32, 8)
    feed(judge, h, 0, 15_500, 20)
    feed(judge, h, 1, 16_500, 10)  # slower: rejected
    feed(judge, h, 2, 17_000, 10)  # the revert, noisy slower still: not judged
    verdicts = judge.check()
    assert [(v.version, v.kept) for v in verdicts] == [(2, False)]
    judge2 = StepJudge(Vetoes())
    h2 = history(8, 32)
    feed(judge2, h2, 0, 15_500, 20)
    feed(judge2, h2, 1, 12_100, 10)
    assert [v.kept for v in judge2.check()] == [True]


def test_steps_across_a_boundary_are_dropped() -> None:
    judge = StepJudge(Vetoes())
    h = history(8, 32)
    assert judge.add(Step(1, BOUNDS[1] - 3, 0, 10**7, CALLS), h) is None
    assert judge.dropped == 1


def test_the_initial_table_is_judged_against_nccls_own_steps() -> None:
    """The job's first table (a cluster finding's 32 channels) against the steps before
    the first epoch, where NCCL decided: slower, so NCCL decides the cell again."""
    vetoes = Vetoes()
    judge = StepJudge(vetoes)
    h = after_nccl(32)
    feed(judge, h, 0, 19_400, 20)  # version 0: NCCL's own choices
    feed(judge, h, 1, 20_800, 8)  # the finding: 7 % slower
    (v,) = judge.check()
    assert (v.version, v.reference, v.kept) == (1, 0, False)
    arm32 = (0, 1, 32, 0)
    assert vetoes.to_nccl(CID, arm32)
    # a cell no tuner runs: NCCL decides it in the next table
    assert vetoes.untuned(table(1, 32).cells[0]).choices == ()
    assert vetoes.untuned(table(1, 12).cells[0]) == table(1, 12).cells[0]
    good = StepJudge(Vetoes())
    feed(good, h, 0, 15_500, 20)
    feed(good, h, 1, 12_100, 8)  # a finding that makes the step faster stays
    assert [(x.reference, x.kept) for x in good.check()] == [(0, True)]
    assert not good.vetoes.bad


def test_only_steps_of_the_same_period_are_compared() -> None:
    """The detector's first lock on a part of the step (12 of 24 calls, half as long) is
    replaced by the whole step: the part-steps are not the reference."""
    judge = StepJudge(Vetoes())
    h = after_nccl(32)
    feed(judge, h, 0, 9_700, 30, calls=12)  # part-steps under NCCL's choices
    feed(judge, h, 1, 19_400 * 1.004, 8)
    assert judge.check() == []  # no reference at this period: nothing judged yet
    judge2 = StepJudge(Vetoes())
    feed(judge2, h, 0, 9_700, 30, calls=12)
    feed(judge2, h, 0, 19_400, 8)  # then whole steps: the version's times start again
    feed(judge2, h, 1, 19_400 * 1.004, 8)
    steps0 = judge2.nccl_steps()
    assert steps0 is not None
    assert (len(steps0.times), steps0.period, steps0.count) == (8, CALLS, 38)
    assert [(x.reference, x.kept) for x in judge2.check()] == [(0, True)]


def test_exploration_cost_counts_the_steps_with_an_explored_call() -> None:
    judge = StepJudge(Vetoes())
    h = history(8)
    for i in range(40):
        explored = i % 4 == 0
        us = 10_500 if explored else 10_000
        judge.add(Step(1, 200 + i * CALLS, 0, us * 1000, CALLS), h, explored)
    cost = judge.exploration_cost()
    assert cost is not None
    assert abs(cost - 10 * 500 / (30 * 10_000 + 10 * 10_500)) < 1e-9


def test_changed_cells_compares_committed_choices() -> None:
    assert changed_cells(table(1, 8), table(2, 8)) == {}
    assert changed_cells(table(1, None), table(2, 32)) == {CID: (None, (0, 1, 32, 0))}

"""Exploration follows measurements, not the simulator's confidence (issue 21.1-21.2).

The shipped model compiles a table for a 16-node H100 job; the class's coverage
is written by hand (the learning loop computes it from the store: see
tests/unit/operator/learning/test_learning_status.py).
"""

from __future__ import annotations

from functools import lru_cache

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.learning import (
    CellCoverage,
    ClassCoverage,
    Departure,
    Finding,
    MeasuredConfig,
)
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Candidate, Cell, Choice, DecisionTable, scale_class
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.runtime.compile import MIN_EXPLORE, compile_table
from dynamiccl.policy.runtime.exploration import (
    CANDIDATES_PER_JOB,
    EXPLORE_CONFIRM,
    EXPLORE_UNSETTLED,
    WATCH_RATE,
    assign,
)
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from tests.topology_samples import h100_job

FEATURES = StateFeatures.model_validate(h100_job(16))
WORLD = scale_class(128, 16)


@lru_cache(maxsize=1)
def table() -> DecisionTable:
    return compile_table(NumpyPolicy.load(DEFAULT_NPZ), FEATURES, NCCLTuningPolicySpec())


def cell(t: DecisionTable, bucket: int) -> Cell:
    got = t.cell(Collective.ALLREDUCE, bucket, WORLD)
    assert got is not None
    return got


def test_a_cell_nobody_measured_is_explored_whatever_the_simulator_says() -> None:
    base = table()
    confident = cell(base, 26)
    assert confident.explore <= 4 * MIN_EXPLORE  # the simulator is sure NCCL is right
    plan = assign(base, None, "job-1")
    mine = cell(plan.table, 26)
    assert mine.explore == EXPLORE_UNSETTLED
    assert 0 < len(mine.candidates) <= CANDIDATES_PER_JOB
    assert set(mine.candidates) <= set(confident.candidates)
    assert plan.explored_cells == sum(1 for c in base.cells if c.candidates)
    assert plan.settled_cells == 0
    # jobs of the class share the candidates out instead of repeating each other
    tried = {
        tuple(c.algo.value for c in cell(assign(base, None, f"job-{i}").table, 26).candidates)
        for i in range(16)
    }
    assert len(tried) > 1


def _measured(c: Cell, n: int) -> list[MeasuredConfig]:
    return [
        MeasuredConfig(
            algo=x.algo.value,
            proto=x.proto.value,
            nchannels=x.nchannels,
            chunk_bytes=x.chunk_bytes,
            calls=32,
            jobs=1,
            speedup=0.8,
        )
        for x in c.candidates[:n]
    ]


def _finding(bucket: int, *, supporting: int, contradicting: int = 0, holds: bool) -> Finding:
    return Finding(
        collective="allreduce", size_bucket=bucket, nranks=128, nnodes=16, algo="tree",
        proto="simple", speedup=1.3, nccl_algo="ring", nccl_proto="simple",
        supporting=supporting, namespaces=1, contradicting=contradicting, holds=holds,
    )  # fmt: skip


def test_measured_candidates_are_not_tried_again_and_found_cells_not_at_all() -> None:
    base = table()
    c24, c26 = cell(base, 24), cell(base, 26)
    departed = CellCoverage(
        collective="allreduce",
        size_bucket=24,
        nranks=128,
        nnodes=16,
        measured=[MeasuredConfig(algo="tree", proto="simple", calls=40, jobs=2, speedup=1.3)],
    )
    coverage = ClassCoverage(
        hardware_class="c-x",
        cells=[
            CellCoverage(
                collective="allreduce",
                size_bucket=26,
                nranks=128,
                nnodes=16,
                measured=_measured(c26, 2),
            ),
            departed,
        ],
        findings=[_finding(24, supporting=2, holds=True)],  # the class starts with it
    )
    plan = assign(base, coverage, "job-1")
    left = set(cell(plan.table, 26).candidates)
    assert left <= set(c26.candidates[2:])
    assert left
    assert (
        plan.table.cell(Collective.ALLREDUCE, 24, WORLD) is None
        or not cell(plan.table, 24).candidates
    )
    assert c24.candidates  # the compiled table had some
    assert plan.settled_cells == 1
    assert plan.measured_candidates >= 2
    # every candidate measured: the cell is not explored either
    full = coverage.model_copy(
        update={
            "cells": [
                CellCoverage(
                    collective="allreduce",
                    size_bucket=26,
                    nranks=128,
                    nnodes=16,
                    measured=_measured(c26, len(c26.candidates)),
                )
            ]
        }
    )
    done = assign(base, full, "job-2").table.cell(Collective.ALLREDUCE, 26, WORLD)
    assert done is None or not done.candidates


def test_one_jobs_departure_is_confirmed_by_the_next_job_not_settled() -> None:
    """Issue 29: a departure only one job measured is that job's word: the next job explores
    it first (even where every candidate was measured), instead of the cell settling on it."""
    base = table()
    c24 = cell(base, 24)
    measured = CellCoverage(
        collective="allreduce", size_bucket=24, nranks=128, nnodes=16,
        measured=[
            *_measured(c24, len(c24.candidates)),
            MeasuredConfig(algo="tree", proto="simple", calls=40, jobs=1, speedup=1.3),
        ],
    )  # fmt: skip
    pending = ClassCoverage(
        hardware_class="c-x", cells=[measured], findings=[_finding(24, supporting=1, holds=False)]
    )
    got = cell(assign(base, pending, "job-2").table, 24)
    # only the configuration to confirm, more often than an unsettled cell: the job must reach
    # the MIN_CALLS a verdict needs before its budget's gate closes
    assert [(c.algo.value, c.proto.value) for c in got.candidates] == [("tree", "simple")]
    assert got.explore == EXPLORE_CONFIRM > EXPLORE_UNSETTLED
    # the same where the class's measurements had settled the cell (NCCL's own and two more)
    settled = pending.model_copy(update={"cells": [measured.model_copy(update={"settled": True})]})
    again = cell(assign(base, settled, "job-2").table, 24)
    assert again.candidates == got.candidates
    # one job for it, one against (a lie, or one noisy verdict): still open, the next job
    # explores it again; more jobs decide
    tied = pending.model_copy(
        update={"findings": [_finding(24, supporting=1, contradicting=1, holds=False)]}
    )
    assert cell(assign(base, tied, "job-3").table, 24).candidates == got.candidates
    # refuted by more jobs than support it: nothing left to confirm, the cell settles
    refuted = pending.model_copy(
        update={"findings": [_finding(24, supporting=1, contradicting=2, holds=False)]}
    )
    done = assign(base, refuted, "job-3").table.cell(Collective.ALLREDUCE, 24, WORLD)
    assert done is None or not done.candidates


def test_a_departure_no_job_has_a_verdict_on_is_confirmed_by_the_next_job() -> None:
    """Issue 29 (`learning_sequence_bench.py --surface tree --seed 2`): two jobs' few calls of
    a configuration, pooled, measured it faster than NCCL's own, but no job ran the MIN_CALLS
    a verdict needs, so there is no finding, pending or held. The next job explores only it,
    at the confirming rate, even where every candidate of the cell was measured."""
    base = table()
    c24 = cell(base, 24)
    measured = CellCoverage(
        collective="allreduce", size_bucket=24, nranks=128, nnodes=16, settled=True,
        measured=[
            *_measured(c24, len(c24.candidates)),
            MeasuredConfig(algo="tree", proto="simple", calls=19, jobs=2, speedup=1.08),
        ],
    )  # fmt: skip
    departure = Departure(
        collective="allreduce", size_bucket=24, nranks=128, nnodes=16, algo="tree",
        proto="simple", speedup=1.08, calls=19, jobs=2,
    )  # fmt: skip
    coverage = ClassCoverage(hardware_class="c-x", cells=[measured], departures=[departure])
    got = cell(assign(base, coverage, "job-3").table, 24)
    assert [(c.algo.value, c.proto.value) for c in got.candidates] == [("tree", "simple")]
    assert got.explore == EXPLORE_CONFIRM
    # once jobs' own comparisons refute it, it is judged: nothing left to confirm
    refuted = coverage.model_copy(
        update={"findings": [_finding(24, supporting=0, contradicting=2, holds=False)]}
    )
    done = assign(base, refuted, "job-4").table.cell(Collective.ALLREDUCE, 24, WORLD)
    assert done is None or not done.candidates


def _settled_cell(choice: Choice) -> tuple[DecisionTable, ClassCoverage]:
    """A one-cell table choosing `choice` at 32 MiB, whose only candidate the class measured
    (the cell is settled), and NCCL measured running Ring/LL128 there as its own decision."""
    nvls = Candidate(algo=Algo.NVLS, proto=Proto.SIMPLE)
    probe = Cell(collective=Collective.ALLREDUCE, bucket=25, scale=WORLD, choices=(choice,),
                 candidates=(nvls,), explore=0.01)  # fmt: skip
    t = DecisionTable(version=1, scales=(WORLD,), cells=(probe,))
    coverage = ClassCoverage(hardware_class="c-x", cells=[CellCoverage(
        collective="allreduce", size_bucket=25, nranks=128, nnodes=16,
        measured=[MeasuredConfig(algo="ring", proto="ll128", calls=900, jobs=3, speedup=1.0,
                                 nccl_own=True),
                  MeasuredConfig(algo="nvls", proto="simple", calls=40, jobs=2, speedup=0.8),
                  MeasuredConfig(algo="tree", proto="ll128", calls=400, jobs=2, speedup=1.2)],
    )])  # fmt: skip
    return t, coverage


def test_a_settled_cell_keeps_nccls_own_pair_watching_its_choice() -> None:
    """Issue 29: every cell of a model keeps a low-rate comparison with NCCL's own choice, so
    that a guardrail watches cells with no candidates left to explore."""
    t, coverage = _settled_cell(Choice(algo=Algo.TREE, proto=Proto.LL128))
    plan = assign(t, coverage, "job-1")
    (settled,) = plan.table.cells
    assert plan.settled_cells == 1
    assert settled.choices[0].algo is Algo.TREE  # the choice stays
    assert [(c.algo, c.proto, c.nchannels) for c in settled.candidates] == [
        (Algo.RING, Proto.LL128, 0)
    ]
    assert settled.explore == WATCH_RATE
    # a settled cell whose choice is NCCL's own pair needs no comparison
    t2, _ = _settled_cell(Choice(algo=Algo.RING, proto=Proto.LL128))
    (own,) = assign(t2, coverage, "job-1").table.cells
    assert own.candidates == ()
    assert own.explore == 0.0
    # without a measurement of NCCL's own decision there: nothing to compare with
    blind = coverage.model_copy(update={"cells": [coverage.cells[0].model_copy(update={
        "measured": [m.model_copy(update={"nccl_own": False}) for m in coverage.cells[0].measured]
    })]})  # fmt: skip
    (unwatched,) = assign(t, blind, "job-1").table.cells
    assert unwatched.candidates == ()

"""Measured beats modelled: a class's findings over the model's table (issue 29).

The shipped model compiles a table for a 16-node H100 job; the class's findings are
written by hand (the learning loop computes them: tests/unit/operator/learning/).
"""

from __future__ import annotations

from dynamiccl.api.learning import ClassCoverage, Finding
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable
from dynamiccl.policy.runtime.exploration import EXPLORE_CONFIRM, assign
from dynamiccl.policy.runtime.measured import CONFIRM_RATE, apply_findings, measured_cells
from tests.unit.policy.runtime.test_exploration import WORLD, table


def _found(bucket: int, *, holds: bool = True, algo: str = "tree") -> Finding:
    return Finding(
        collective="allreduce", size_bucket=bucket, nranks=128, nnodes=16, algo=algo,
        proto="simple", speedup=1.2, nccl_algo="ring", nccl_proto="simple", supporting=2,
        namespaces=1, holds=holds,
    )  # fmt: skip


def _cell(t: DecisionTable, bucket: int) -> Cell:
    got = t.cell(Collective.ALLREDUCE, bucket, WORLD)
    assert got is not None
    return got


def test_a_holding_finding_is_the_cells_first_choice_with_nccls_pair_confirmed() -> None:
    base = table()
    model = _cell(base, 26)
    cov = ClassCoverage(hardware_class="h", findings=[_found(26), _found(24, holds=False)])
    # as the operator builds it: the job's exploration assignment, then the findings
    got = apply_findings(assign(base, cov, "job-1").table, cov)
    cell = _cell(got, 26)
    assert cell.choices[0] == Choice(algo=Algo.TREE, proto=Proto.SIMPLE)
    assert model.choices[:1] != cell.choices[:1]  # not what the model chose (NCCL decided)
    assert [(c.algo, c.proto) for c in cell.candidates] == [(Algo.RING, Proto.SIMPLE)]
    assert cell.explore == CONFIRM_RATE
    # one job's word (not holding) changes no choice: the cell explores it instead
    assert _cell(got, 24).choices == _cell(base, 24).choices
    (confirm,) = _cell(got, 24).candidates  # only it: the model's candidates wait
    assert confirm.algo is Algo.TREE
    assert _cell(got, 24).explore == EXPLORE_CONFIRM
    # every other cell is the assignment's
    assert [c for c in got.cells if c.bucket != 26] == [
        c for c in assign(base, cov, "job-1").table.cells if c.bucket != 26
    ]
    (listed,) = measured_cells(got, cov)
    assert listed.size_bucket == 26
    assert measured_cells(base, cov) == []  # the model's own table ran no finding


def test_whatever_model_version_compiled_the_table() -> None:
    """A table of another model (here: NCCL's choice in every cell) gets the same cell."""
    base = table()
    bare = base.model_copy(update={"cells": ()})
    cov = ClassCoverage(hardware_class="h", findings=[_found(26)])
    got = apply_findings(bare, cov)
    assert _cell(got, 26).choices[0] == _cell(apply_findings(base, cov), 26).choices[0]
    assert len(got.cells) == 1
    assert apply_findings(base, None) == base


def test_a_withdrawn_finding_leaves_every_models_table() -> None:
    """Issue 29 (`learning_sequence_bench.py --change-back-after 6`): six jobs measured Tree
    faster, the model retrained on them chose Tree, then job 7 measured it slower and the
    finding was withdrawn; job 8, on that model, still ran Tree (0.80x). A cell whose first
    choice is a withdrawn finding's pair now runs NCCL's own choice; a finding only waiting
    for confirmation (nobody contradicted it) leaves the model's choice alone."""
    base = table()
    tree = Choice(algo=Algo.TREE, proto=Proto.SIMPLE)
    learned = base.model_copy(
        update={
            "cells": tuple(
                c.model_copy(update={"choices": (tree, *c.choices)}) if c.bucket in (24, 26) else c
                for c in base.cells
            )
        }
    )
    withdrawn = _found(26, holds=False).model_copy(update={"supporting": 6, "contradicting": 1})
    pending = _found(24, holds=False).model_copy(update={"supporting": 1})
    cov = ClassCoverage(hardware_class="h", findings=[withdrawn, pending])
    got = apply_findings(learned, cov)
    assert _cell(got, 26).choices == ()  # NCCL decides (was: tree, the model's learned gain)
    assert _cell(got, 24).choices[0] == tree  # not contradicted: the model's choice stands
    assert [c for c in got.cells if c.bucket != 26] == [c for c in learned.cells if c.bucket != 26]
    assert measured_cells(got, cov) == []

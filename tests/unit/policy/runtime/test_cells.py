"""The batched cell builder gives exactly the cells the one-row rule gives.

`cells` works on all of a job's rows at once; `cell` is the rule for one row. Rankings
come from a seeded random network (compile_golden.random_model) over a real job, and from
hand-made rows that hit the edges: probabilities on a rounding boundary of the 1/8-octave
steps, rows with padding, a first choice that is NCCL's own, and one candidate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynamiccl.api.nccl import Collective
from dynamiccl.api.table import WEIGHT_MAX, Cell
from dynamiccl.policy.runtime.cells import COLLS, cell, cells
from dynamiccl.policy.runtime.compile import communicators
from dynamiccl.policy.runtime.decide import Decider, stacked_inputs
from tests.unit.policy.runtime.compile_golden import jobs, random_model

Rows = tuple[np.ndarray, np.ndarray, np.ndarray]


def _one_by_one(rows: Rows, coords: tuple[np.ndarray, ...], n_cand: int) -> list[Cell]:
    acts, probs, picks = rows
    out = []
    for i in range(len(acts)):
        c = cell(
            COLLS[int(coords[0][i])],
            int(coords[1][i]),
            int(coords[2][i]),
            acts[i].tolist(),
            probs[i].tolist(),
            picks[i].tolist(),
            n_cand,
        )
        if c is not None:
            out.append(c)
    return out


def _coords(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    i = np.arange(n)
    return i % len(Collective), 3 + i % 33, i // (len(Collective) * 33)


def _policy_rows(n_cand: int) -> Rows:
    job = jobs()["3d tp4 dp4 pp2 on 4x8"]
    model = random_model(7, 1.0, 5.0)
    deciders = [Decider(model, c.context) for c in communicators(job)]
    b = np.arange(3, 36)
    colls = np.repeat(np.arange(len(Collective)), len(b))
    obs, feasible, picks = stacked_inputs(deciders, colls, np.tile(2.0 ** (b + 0.5), 5))
    acts, probs = model.top_actions(obs, feasible, 4 + n_cand, picks)
    return acts, probs, picks


@pytest.mark.parametrize("n_cand", [0, 1, 2, 4])
def test_cells_of_a_policys_rankings_are_the_rules_cells(n_cand: int) -> None:
    rows = _policy_rows(n_cand)
    coords = _coords(len(rows[0]))
    got = cells(*rows, coords, n_cand)
    want = _one_by_one(rows, coords, n_cand)
    assert len(want) > 100
    assert [c.model_dump_json() for c in got] == [c.model_dump_json() for c in want]
    assert got == want


def test_rows_on_rounding_boundaries_and_with_padding() -> None:
    """Shares and weight ratios whose 8·log2 lies within 1e-12 of a half step (numpy's and
    the C library's log2 may round those differently), padded rows, NCCL's pick first."""
    rng = np.random.default_rng(0)
    n, k = 4000, 8
    acts = rng.integers(0, [7, 3, 9, 8], size=(n, k, 4))
    picks = acts[:, 0, :2].copy()
    agree = rng.random(n) < 0.5
    acts[agree, 0, 2:] = 0  # the first choice is NCCL's own pick
    edge = 2.0 ** ((rng.integers(-120, 0, size=(n, k)) + 0.5) / 8)  # half-step ratios
    probs = np.where(rng.random((n, k)) < 0.5, edge, rng.random((n, k)))
    probs[:, 0] = 1.0
    probs[rng.random((n, k)) < 0.1] = 0.0  # padding
    probs[:, 0] = np.where(rng.random(n) < 0.01, 0.5, probs[:, 0])
    coords = _coords(n)
    for n_cand in (1, 4):
        got = cells(acts, probs, picks, coords, n_cand)
        assert got == _one_by_one((acts, probs, picks), coords, n_cand)
    assert math.log2(WEIGHT_MAX) > 15  # the weight steps cover 1 .. 1/WEIGHT_MAX

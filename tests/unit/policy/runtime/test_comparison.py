"""The guardrail's comparison arm of a static table (policy/runtime/comparison.py)."""

from __future__ import annotations

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice
from dynamiccl.policy.runtime.comparison import (
    COMPARE_EXPLORE,
    compare_half_life,
    comparison_cells,
    with_comparison,
)


def _cell(*choices: Choice, bucket: int = 20) -> Cell:
    return Cell(collective=Collective.ALLREDUCE, bucket=bucket, scale=3, choices=choices)


def test_a_forced_choice_gets_nccls_pick_as_its_one_candidate() -> None:
    c = with_comparison(
        _cell(Choice(algo=Algo.TREE, proto=Proto.LL, nchannels=8)), (Algo.RING, Proto.SIMPLE)
    )
    (cand,) = c.candidates
    assert (cand.algo, cand.proto, cand.nchannels, cand.chunk_bytes) == (
        Algo.RING,
        Proto.SIMPLE,
        0,
        0,
    )
    assert c.explore == COMPARE_EXPLORE


def test_nothing_to_compare_where_the_cell_runs_nccls_own_choice() -> None:
    same = _cell(Choice(algo=Algo.RING, proto=Proto.SIMPLE))
    assert with_comparison(same, (Algo.RING, Proto.SIMPLE)) == same
    assert with_comparison(_cell(), (Algo.RING, Proto.SIMPLE)) == _cell()
    # NCCL's pair at pinned channels is a departure: compared
    pinned = _cell(Choice(algo=Algo.RING, proto=Proto.SIMPLE, nchannels=4))
    assert with_comparison(pinned, (Algo.RING, Proto.SIMPLE)).candidates


def test_cells_without_a_known_pick_are_left_alone() -> None:
    a, b = (
        _cell(Choice(algo=Algo.TREE, proto=Proto.LL)),
        _cell(Choice(algo=Algo.TREE, proto=Proto.LL), bucket=21),
    )
    out = comparison_cells([a, b], {(Collective.ALLREDUCE, 20, 3): (Algo.RING, Proto.SIMPLE)})
    assert out[0].candidates
    assert out[1] == b


@pytest.mark.parametrize("min_samples", [1, 4, 20, 50, 1000, 100_000])
def test_the_first_half_life_gives_min_samples_comparisons(min_samples: int) -> None:
    h = compare_half_life(min_samples)
    assert COMPARE_EXPLORE * 2**h >= min_samples
    assert h == 0 or COMPARE_EXPLORE * 2 ** (h - 1) < min_samples

"""The decision rule both policy implementations share."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.policy.runtime.decision_rule import fall_back_to_pick, merge_with_beam, pooled_pair


def test_an_unconfident_deviation_falls_back_to_nccls_pick() -> None:
    acts = np.array([[1, 0, 2, 1], [1, 0, 2, 1], [0, 0, 0, 0]], dtype=np.int64)
    logp = np.log(np.array([0.5, 0.5, 0.9]))
    pair = np.zeros((3, 2, 2))
    pair[0, 1, 0] = 0.6  # row 0: leaves NCCL's pair with 0.6 < tau
    pair[1, 1, 0] = 0.95  # row 1: confident deviation, kept
    pair[2, 0, 0] = 0.95  # row 2: is NCCL's pick already
    pick = np.zeros((3, 2), dtype=np.int64)
    feasible = np.ones((3, 2, 2, 3, 2), dtype=bool)
    back = fall_back_to_pick(acts, logp, pair, pick=pick, feasible=feasible, tau=0.8)
    assert back.tolist() == [True, False, False]
    assert acts.tolist() == [[0, 0, 0, 0], [1, 0, 2, 1], [0, 0, 0, 0]]


def test_no_fall_back_to_an_infeasible_pick() -> None:
    acts = np.array([[1, 0, 0, 0]], dtype=np.int64)
    pair = np.full((1, 2, 2), 0.1)
    feasible = np.ones((1, 2, 2, 1, 1), dtype=bool)
    feasible[0, 0, 0] = False
    back = fall_back_to_pick(
        acts, np.log([0.1]), pair, pick=np.zeros((1, 2), np.int64), feasible=feasible, tau=0.8
    )
    assert not back.any()
    assert acts.tolist() == [[1, 0, 0, 0]]


def test_merge_puts_the_decision_first_and_pads_with_probability_zero() -> None:
    first = np.array([[0, 0, 0, 0]], dtype=np.int64)
    beam_a = np.array([[[0, 0, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0]]], dtype=np.int64)
    beam_p = np.array([[0.5, 0.3, 0.0]])
    out, probs = merge_with_beam(first, np.array([0.5]), beam_a, beam_p, k=3)
    assert out.tolist() == [[[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]]
    assert probs.tolist() == [[0.5, 0.3, 0.0]]


def test_peers_pool_only_the_rows_that_leave_nccls_pair() -> None:
    acts = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=np.int64)
    pick = np.zeros((3, 2), dtype=np.int64)
    pair = np.zeros((3, 2, 2))
    pair[:, 1, 0] = 0.9
    pair[1, 0, 0] = 0.7
    seen: list[list[int]] = []

    def peer(rows: np.ndarray) -> np.ndarray:
        seen.append(rows.tolist())
        out = np.zeros((len(rows), 2, 2))
        out[:, 1, 0] = 0.3
        return out

    pooled = pooled_pair(acts, pair, pick, [peer, peer])
    assert seen == [[0, 2], [0, 2]]  # row 1 keeps NCCL's pair: no peer runs on it
    assert pooled[0, 1, 0] == pytest.approx(0.5)  # (0.9 + 0.3 + 0.3) / 3
    assert pooled[1].tolist() == pair[1].tolist()
    assert pair[0, 1, 0] == 0.9  # the input is not modified
    feasible = np.ones((3, 2, 2, 1, 1), dtype=bool)
    back = fall_back_to_pick(
        acts, np.log([0.9, 0.7, 0.9]), pooled, pick=pick, feasible=feasible, tau=0.8
    )
    assert back.tolist() == [True, False, True]  # 0.9 alone would have kept rows 0 and 2
    assert pooled_pair(acts, pair, pick, []) is pair

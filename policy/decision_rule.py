"""The rule that turns a network's outputs into a decision and a ranking.

Shared by the torch `inference.Policy` and the torch-free `numpy_policy.NumpyPolicy`,
so both decide by the same code: only the network's forward pass differs.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def fall_back_to_pick(
    acts: NDArray[np.int64],
    logp: NDArray[np.float64],
    pair: NDArray[np.floating],
    *,
    pick: NDArray[np.int64],
    feasible: NDArray[np.bool_],
    tau: float,
) -> NDArray[np.bool_]:
    """Rows whose greedy action leaves NCCL's choice without confidence `tau`.

    Those rows of `acts` [n, 4] are set, in place, to NCCL's (algo, proto) `pick`
    with its own channels and chunk (index 0); the returned mask says which rows
    changed, so the caller re-scores them. `pair` [n, A, P] holds the marginal
    probabilities of every (algo, proto); `logp` [n] the greedy actions' log-probs.
    """
    rows = np.arange(len(acts))
    p_pair = pair[rows, acts[:, 0], acts[:, 1]]
    other_pair = (acts[:, 0] != pick[:, 0]) | (acts[:, 1] != pick[:, 1])
    other_knobs = (acts[:, 2] != 0) | (acts[:, 3] != 0)
    # Leaving NCCL's pair needs confidence in the pair; keeping the pair but
    # forcing channels/chunk needs confidence in those given the pair.
    conf = np.where(other_pair, p_pair, np.exp(logp) / np.maximum(p_pair, 1e-12))
    ok = feasible[rows, pick[:, 0], pick[:, 1], 0, 0]
    back: NDArray[np.bool_] = (other_pair | other_knobs) & (conf < tau) & ok
    if back.any():
        zeros = np.zeros(back.sum())
        acts[back] = np.stack([pick[back, 0], pick[back, 1], zeros, zeros], 1)
    return back


def merge_with_beam(
    first: NDArray[np.int64],
    p_first: NDArray[np.float64],
    beam_a: NDArray[np.int64],
    beam_p: NDArray[np.float64],
    k: int,
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The decision first, then the beam's others in beam order: [n, k, 4], probs [n, k].

    Beam entries equal to the decision or of probability 0 are skipped; rows with
    fewer than k others are padded with the decision at probability 0.
    """
    n = beam_a.shape[0]
    out = np.repeat(first[:, None, :], k, axis=1)
    probs = np.zeros((n, k))
    probs[:, 0] = p_first
    keep = ~(beam_a == first[:, None, :]).all(-1) & (beam_p > 0)
    # Stable order of the kept beam entries per row: kept ones first.
    order = np.argsort(~keep, axis=1, kind="stable")[:, : k - 1]
    rows = np.arange(n)[:, None]
    taken = keep[rows, order]
    out[:, 1:][taken] = beam_a[rows, order][taken]
    probs[:, 1:][taken] = beam_p[rows, order][taken]
    return out, probs

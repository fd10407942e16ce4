"""The rule that turns a network's outputs into a decision and a ranking.

Shared by the torch `inference.Policy` and the torch-free `numpy_policy.NumpyPolicy`,
so both decide by the same code: only the network's forward pass differs.

A model may carry peers: networks trained the same way from other seeds. The
decision and the ranking are the first network's; the peers only give a second
opinion on leaving NCCL's (algorithm, protocol): the confidence `tau` is
compared with the members' mean probability of the new pair (`pooled_pair`).
Where the members disagree, a confident but wrong deviation of one network no
longer stands (docs/policy.md §5 has the measurements).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

PairFn = Callable[[NDArray[np.int64]], NDArray[np.floating]]
"""A peer's marginal (algo, proto) probabilities [m, A, P] for the given rows."""


def pooled_pair(
    acts: NDArray[np.int64],
    pair: NDArray[np.floating],
    pick: NDArray[np.int64],
    peers: list[PairFn],
) -> NDArray[np.floating]:
    """`pair` [n, A, P] with the rows whose greedy pair leaves `pick` averaged over the peers.

    Only those rows can change the decision, so the peers run on them alone (a
    table compile leaves NCCL's pick in most cells: the peers cost little).
    """
    rows = np.flatnonzero((acts[:, 0] != pick[:, 0]) | (acts[:, 1] != pick[:, 1]))
    if not peers or not rows.size:
        return pair
    out = pair.copy()
    total = pair[rows].astype(np.float64)
    for peer in peers:
        total = total + peer(rows)
    out[rows] = total / (1 + len(peers))
    return out


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

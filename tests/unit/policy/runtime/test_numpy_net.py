"""The rearranged numpy network computes what the torch network computes, head by head.

`Net` splits every head's linear map over `concat(core, embeddings...)` into a
core part and per-option tables; here each piece is compared with the torch
module it replaces, on random observations and every option of every head.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynamiccl.policy.runtime.encode import OBS_DIM
from dynamiccl.policy.runtime.numpy_net import (
    Net,
    Trunk,
    any_last,
    log_softmax,
    max_last,
    sum_last,
)
from dynamiccl.policy.runtime.space import HEADS
from dynamiccl.policy.train.inference import Policy, _trunk, new_policy

ATOL = 2e-5  # float32 logits summed in a different order
Pair = tuple[Policy, Net, Trunk, torch.Tensor]


@pytest.fixture(scope="module")
def pair() -> Pair:
    pol = new_policy(5, hidden=32)
    pol.net.eval()
    with torch.no_grad():  # make the embedding and pick-gain contributions non-trivial
        pol.net.pick_gain.copy_(torch.tensor([1.7, -0.6]))
    w = {k: v.detach().numpy() for k, v in pol.net.state_dict().items()}
    net = Net(w, HEADS, 32)
    obs = np.random.default_rng(3).standard_normal((40, OBS_DIM)).astype(np.float32)
    with torch.no_grad():
        h = _trunk(pol.net, obs)
    return pol, net, net.trunk(obs, pol.net.pick_offsets), h


def test_observation_width_comes_from_the_weights() -> None:
    pol = new_policy(1, hidden=16)
    w = {k: v.detach().numpy() for k, v in pol.net.state_dict().items()}
    assert Net(w, HEADS, 16).obs_dim == OBS_DIM


def test_trunk_and_algorithm_logits_match_torch(
    pair: Pair,
) -> None:
    pol, _net, t, h = pair
    np.testing.assert_allclose(t.core, pol.net._core(h).numpy(), atol=ATOL, rtol=0)
    with torch.no_grad():
        algo = pol.net._algo_logits(h).numpy()
    np.testing.assert_allclose(t.algo, algo, atol=ATOL, rtol=0)


def test_every_heads_logits_match_torch_for_every_earlier_choice(
    pair: Pair,
) -> None:
    pol, net, t, h = pair
    m = pol.net
    core = m._core(h)
    n = core.shape[0]
    a_n, p_n, c_n, _ = HEADS.as_tuple()
    checked = 0
    with torch.no_grad():
        for a in range(a_n):
            ia = torch.full((n,), a)
            ea = m.emb_algo(ia)
            want = m._proto_logits(h, ea).numpy()
            got = net.proto_logits(t, np.full(n, a))
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
            for p in range(p_n):
                ep = m.emb_proto(torch.full((n,), p))
                want = m.head_ch(torch.cat([core, ea, ep], -1)).numpy()
                got = net.ch_logits(t, np.full(n, a), np.full(n, p))
                np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
                for c in range(c_n):
                    ec = m.emb_ch(torch.full((n,), c))
                    want = m.head_chunk(torch.cat([core, ea, ep, ec], -1)).numpy()
                    got = net.chunk_logits(t, np.full(n, a), np.full(n, p), np.full(n, c))
                    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
                    checked += 1
    assert checked == a_n * p_n * c_n


def test_choices_broadcast_against_rows(pair: Pair) -> None:
    """`lead` axes: per-row choice lists [N, k] and all-options grids give the same logits
    as one choice at a time."""
    _pol, net, t, _h = pair
    n = t.core.shape[0]
    rng = np.random.default_rng(0)
    a_n, p_n, c_n, _ = HEADS.as_tuple()
    a, p, c = (rng.integers(0, x, (n, 3)) for x in (a_n, p_n, c_n))
    grid = net.chunk_logits(t, a, p, c, lead=1)  # [N, 3, K]
    for j in range(3):
        np.testing.assert_array_equal(grid[:, j], net.chunk_logits(t, a[:, j], p[:, j], c[:, j]))
    ar, pr = np.arange(a_n), np.arange(p_n)
    full = net.ch_logits(t, ar[:, None], pr[None, :], lead=2)  # [N, A, P, C]
    assert full.shape == (n, a_n, p_n, c_n)
    np.testing.assert_array_equal(full[:, 1, 2], net.ch_logits(t, np.full(n, 1), np.full(n, 2)))


@pytest.mark.parametrize("n", range(1, 20))
def test_short_axis_reductions_are_numpys_bit_for_bit(n: int) -> None:
    """sum_last / max_last / any_last replace numpy's reductions over a short last axis for
    speed; the decisions depend on every bit of the sums, so they must add in numpy's order."""
    rng = np.random.default_rng(n)
    for shape in ((5000, n), (500, 9, n), (100, 7, 3, n)):
        x = np.exp(rng.standard_normal(shape).astype(np.float32) * 4)
        assert np.array_equal(sum_last(x), x.sum(-1))
        y = np.where(rng.random(shape) < 0.2, np.float32(-1e9), np.log(x))
        assert np.array_equal(max_last(y), y.max(-1))
        b = rng.random(shape) < 0.1
        assert np.array_equal(any_last(b), b.any(-1))
    z = rng.standard_normal((300, n)).astype(np.float32)
    ref = z - z.max(-1, keepdims=True)
    assert np.array_equal(log_softmax(z), ref - np.log(np.exp(ref).sum(-1, keepdims=True)))

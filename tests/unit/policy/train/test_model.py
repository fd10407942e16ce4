"""The masked autoregressive LSTM actor-critic."""

from __future__ import annotations

import torch

from dynamiccl.policy.runtime.heads import HeadSizes
from dynamiccl.policy.train.model import PolicyNet, build

HEADS = HeadSizes(7, 3, 5, 4)


def _net(seed: int = 0) -> PolicyNet:
    torch.manual_seed(seed)
    return PolicyNet(10, HEADS, hidden=32, emb=4)


def _feasible(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    f = torch.rand((n, *HEADS.as_tuple()), generator=g) < 0.3
    f[:, 1, 2, 0, 0] = True  # at least one feasible action everywhere
    return f


def _trunk(net: PolicyNet, n: int, t: int = 1) -> torch.Tensor:
    obs = torch.randn(n, t, 10, generator=torch.Generator().manual_seed(2))
    prev = torch.full((n, t, 4), -1, dtype=torch.long)
    h, _ = net.trunk(obs, prev, torch.zeros(n, t))
    return h[:, -1]


def test_samples_are_always_feasible() -> None:
    net = _net()
    f = _feasible(256)
    h = _trunk(net, 256)
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        step = net.act(h, f, generator=g)
        a = step.actions
        assert f[torch.arange(256), a[:, 0], a[:, 1], a[:, 2], a[:, 3]].all()
        assert torch.isfinite(step.log_prob).all()
        assert (step.entropy >= 0).all()


def test_scoring_given_actions_matches_sampling() -> None:
    net = _net()
    f = _feasible(64)
    h = _trunk(net, 64)
    step = net.act(h, f, generator=torch.Generator().manual_seed(4))
    again = net.act(h, f, actions=step.actions)
    assert torch.allclose(step.log_prob, again.log_prob)


def test_joint_log_probs_is_a_distribution_over_feasible_actions() -> None:
    net = _net()
    f = _feasible(6)
    h = _trunk(net, 6)
    joint = net.joint_log_probs(h, f)
    assert joint.shape == (6, *HEADS.as_tuple())
    assert torch.isneginf(joint[~f]).all()
    for i in range(6):
        assert abs(torch.exp(joint[i][f[i]]).sum().item() - 1.0) < 1e-4
    # The greedy path of the heads has the joint log-prob act() reports.
    step = net.act(h, f, greedy=True)
    a = step.actions
    picked = joint[torch.arange(6), a[:, 0], a[:, 1], a[:, 2], a[:, 3]]
    assert torch.allclose(picked, step.log_prob, atol=1e-4)


def test_lstm_state_carries_context() -> None:
    net = _net()
    obs = torch.randn(2, 6, 10)
    prev = torch.zeros(2, 6, 4, dtype=torch.long)
    h_all, _ = net.trunk(obs, prev, torch.zeros(2, 6))
    # Step-by-step with carried state equals the whole-sequence pass.
    state = None
    outs = []
    for t in range(6):
        h, state = net.trunk(obs[:, t : t + 1], prev[:, t : t + 1], torch.zeros(2, 1), state)
        outs.append(h)
    assert torch.allclose(torch.cat(outs, 1), h_all, atol=1e-5)
    # And the same step without the history differs.
    h_fresh, _ = net.trunk(obs[:, 5:6], prev[:, 5:6], torch.zeros(2, 1))
    assert not torch.allclose(h_fresh[:, 0], h_all[:, 5])


def test_build_round_trip() -> None:
    net = _net()
    clone = build(net.config())
    clone.load_state_dict(net.state_dict())
    h = _trunk(net, 3)
    h2 = _trunk(clone, 3)
    assert torch.allclose(h, h2)

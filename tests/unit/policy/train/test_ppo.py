"""PPO pieces: rollouts respect masks, GAE is right, updates move the policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.runtime.space import ActionLimits
from dynamiccl.policy.train.curriculum import Stage, sample_job
from dynamiccl.policy.train.inference import new_policy
from dynamiccl.policy.train.model import PolicyNet
from dynamiccl.policy.train.ppo import PPOConfig, RewardConfig, Rollout, advantages, collect, update
from dynamiccl.policy.train.train import load_config

CFG = PPOConfig(jobs=3, steps=5, epochs=2, minibatch_jobs=2)


def _roll(reward: RewardConfig | None = None) -> tuple[Rollout, PolicyNet]:
    rng = np.random.default_rng(0)
    jobs = [sample_job(rng, Stage.RACK) for _ in range(3)]
    pol = new_policy(0, hidden=16)
    roll = collect(
        pol.net,
        jobs,
        CFG,
        reward=reward or RewardConfig(),
        limits=ActionLimits(),
        rng=rng,
        gen=torch.Generator().manual_seed(0),
    )
    return roll, pol.net


def test_rollout_shapes_and_feasibility() -> None:
    roll, _ = _roll()
    assert roll.obs.shape[:2] == (3, 5)
    a = roll.actions
    idx = (a[..., 0], a[..., 1], a[..., 2], a[..., 3])
    picked = roll.masks[torch.arange(3)[:, None], torch.arange(5)[None, :], *idx]
    assert picked.all()
    assert (roll.prev_action[:, 0] == -1).all()
    assert (roll.prev_action[:, 1:] == roll.actions[:, :-1]).all()
    assert torch.isfinite(roll.reward).all()


def test_penalties_lower_the_reward() -> None:
    base, _ = _roll()
    pen, _ = _roll(RewardConfig(switching=1.0, probing=1.0))
    assert float(pen.reward.sum()) < float(base.reward.sum())


def test_gae_with_gamma_zero_is_reward_minus_value() -> None:
    roll, _ = _roll()
    advantages(roll, gamma=0.0, lam=0.95)
    assert roll.advantage is not None
    assert torch.allclose(roll.advantage, roll.reward - roll.value)


def test_update_changes_the_policy_and_needs_advantages() -> None:
    roll, net = _roll()
    with pytest.raises(ValueError, match="advantages"):
        update(net, torch.optim.Adam(net.parameters()), roll, CFG, torch.Generator())
    advantages(roll, CFG.gamma, CFG.lam)
    before = [p.detach().clone() for p in net.parameters()]
    stats = update(net, torch.optim.Adam(net.parameters(), lr=1e-3), roll, CFG, torch.Generator())
    assert set(stats) == {"loss_pi", "loss_v", "entropy", "clip_frac"}
    assert any(not torch.equal(b, p) for b, p in zip(before, net.parameters(), strict=True))


def test_reward_weights_come_from_the_training_config() -> None:
    """PPO's reward weights are a training setting (train.yaml `reward:`); the cluster's
    NCCLTuningPolicy no longer carries them (nothing there acted on them)."""
    cfg = load_config(Path(__file__).resolve().parents[4] / "policy" / "models" / "train.yaml")
    assert cfg.reward == RewardConfig(latency=1.0, switching=0.01, probing=0.0, tier_penalty=0.5)
    with pytest.raises(ValidationError, match="rewardWeights"):
        NCCLTuningPolicySpec.model_validate({"rewardWeights": {"latency": 1.0}})

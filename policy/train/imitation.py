"""Warm start: imitate the simulator's best configuration (supervised).

The simulator's times of every (algorithm, protocol) are known for the
labelled calls, so the best configuration is known too. Before PPO, the
policy is trained by cross-entropy on it (at NCCL's own channels and chunk,
which the simulator never lets a variant beat), with two refinements:

- ties within 0.1 % go to NCCL's own pick: where NCCL's model is right the
  policy learns to agree with it, not to pick an equivalent alternative;
- each call is weighted 1 + kappa * log(t_nccl / t_best): the rare calls where
  NCCL's model is wrong and the choice matters weigh more;
- plus the expected regret E_(a,p)~pi[log(t(a,p) / t_best)] under the policy's
  own (algorithm, protocol) distribution, the exact policy-gradient objective
  with full information, which charges costly mistakes more than cheap ones;
- optionally (`loss_aversion`, off in the shipped model), the expected loss
  against NCCL's own pick, E_(a,p)~pi[max(0, log(t(a,p) / t_nccl))]: the
  weighting above favours leaving NCCL wherever that gains, with no matching
  price on leaving it where that loses. On a development set its effect was
  within the run-to-run spread and it gave up real gains on EFA
  (docs/policy.md §4), so it stays an option.

PPO then fine-tunes with the full reward (noise, switching, probing, tiers).
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.nccl import Proto
from dynamiccl.policy.runtime.space import ActionLimits, joint_mask
from dynamiccl.policy.train.dataset import Labelled
from dynamiccl.policy.train.model import PolicyNet

N_P = len(Proto)
TIE = 1e-3


class ImitationConfig(BaseModel):
    """Supervised warm-start settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=1500, ge=0)
    batch: int = Field(default=512, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    kappa: float = Field(default=20.0, ge=0, description="extra weight per log-speedup at stake")
    regret_coef: float = Field(default=10.0, ge=0, description="weight of the expected-regret term")
    loss_aversion: float = Field(
        default=0.0, ge=0, description="weight of the expected loss against NCCL's own pick"
    )


def targets(data: Labelled) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Target actions [n, 4] (channel/chunk option 0) and log(t_nccl / t_best) per call."""
    n = len(data)
    flat = data.times.reshape(n, -1)
    best = data.best_time
    nccl_ok = flat[np.arange(n), data.nccl_ap] <= best * (1 + TIE)
    ap = np.where(nccl_ok, data.nccl_ap, data.best_ap)
    acts = np.zeros((n, 4), dtype=np.int64)
    acts[:, 0] = ap // N_P
    acts[:, 1] = ap % N_P
    stake = np.log(np.maximum(data.nccl_time / best, 1.0))
    return acts, stake


def train_imitation(
    net: PolicyNet,
    data: Labelled,
    cfg: ImitationConfig,
    *,
    limits: ActionLimits,
    gen: torch.Generator,
    rng: np.random.Generator,
) -> list[float]:
    """Cross-entropy steps on random minibatches; returns the loss per step."""
    acts, stake = targets(data)
    w = 1.0 + cfg.kappa * stake
    obs = torch.from_numpy(data.obs)
    masks = torch.from_numpy(joint_mask(data.ap_mask, limits))
    acts_t = torch.from_numpy(acts)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(data.times / data.best_time[:, None, None])
    regret = torch.from_numpy(np.where(np.isfinite(r), np.minimum(r, 5.0), 0.0).astype(np.float32))
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = np.log(data.times / data.nccl_time[:, None, None])
    loss_vs_nccl = torch.from_numpy(
        np.where(np.isfinite(lv), np.clip(lv, 0.0, 5.0), 0.0).astype(np.float32)
    )
    w_t = torch.from_numpy(w.astype(np.float32))
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    losses = []
    n = len(data)
    for _ in range(cfg.steps):
        idx = torch.from_numpy(rng.integers(0, n, size=min(cfg.batch, n)))
        x = obs[idx][:, None, :]
        prev = torch.full((len(idx), 1, 4), -1, dtype=torch.long)
        h, _ = net.trunk(x, prev, torch.zeros(len(idx), 1))
        step = net.act(h[:, 0], masks[idx], actions=acts_t[idx], generator=gen)
        loss = -(w_t[idx] * step.log_prob).sum() / w_t[idx].sum()
        if cfg.regret_coef > 0 or cfg.loss_aversion > 0:
            pairs = net.pair_log_probs(h[:, 0], masks[idx]).exp()
            cost = cfg.regret_coef * regret[idx] + cfg.loss_aversion * loss_vs_nccl[idx]
            loss = loss + (pairs * cost).sum((1, 2)).mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(float(loss.detach()))
    return losses

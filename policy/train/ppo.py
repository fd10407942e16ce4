"""PPO for the recurrent policy: jobs issue call streams, the simulator measures them.

An episode is one job (curriculum.Job) issuing `steps` calls, each from one of
its streams (collective, size). The LSTM sees every call's observation plus the
previous action and reward, so it can adapt within the job. The measured time
is the simulator's mean for the chosen configuration with seeded lognormal
jitter and (multi-node) congestion. Reward, normalised by NCCL's default:

    r = - w_latency   * log(t / t_nccl_default)
        - w_switching * 1[the stream's configuration changed]
        - w_probing   * 1[the action is not the policy's greedy one]
        - w_tier      * (tier_max / 3) * max(0, log(t / t_nccl_default))

The weights are a simulator-training setting (TrainConfig.reward, `reward:` in
policy/models/train.yaml), not a cluster one: the NCCLTuningPolicy has no reward
weights, since nothing in the cluster (the sidecar's online tuner, the retrain
from the store) optimises this shaped reward. The tier term charges a slowdown
more on communicators that span slower tiers (cross-rack, cross-zone), where a
slow collective stalls more of the cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.policy.runtime.actions import action_mask
from dynamiccl.policy.runtime.encode import JobContext, encode_calls
from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS, ActionLimits, joint_mask
from dynamiccl.policy.sim.simulator import NoiseModel, Simulator
from dynamiccl.policy.train.curriculum import Job
from dynamiccl.policy.train.model import PolicyNet


class RewardConfig(BaseModel):
    """Reward weights of simulator training (`reward:` in policy/models/train.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency: float = Field(default=1.0, gt=0)
    switching: float = Field(default=0.0, ge=0)
    probing: float = Field(default=0.0, ge=0)
    tier_penalty: float = Field(default=0.0, ge=0)


class PPOConfig(BaseModel):
    """PPO hyper-parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobs: int = Field(default=32, ge=1, description="episodes per iteration")
    steps: int = Field(default=16, ge=1, description="calls per episode")
    epochs: int = Field(default=4, ge=1)
    minibatch_jobs: int = Field(default=16, ge=1)
    lr: float = Field(default=3e-4, gt=0)
    gamma: float = Field(default=0.9, ge=0, le=1)
    lam: float = Field(default=0.95, ge=0, le=1)
    clip: float = Field(default=0.2, gt=0)
    value_coef: float = Field(default=0.5, ge=0)
    entropy_coef: float = Field(default=0.003, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    noise: NoiseModel = NoiseModel(stddev=0.04, congestion_prob=0.05, congestion_max=0.5)


@dataclass
class _Env:
    """One job's episode environment."""

    job: Job
    sim: Simulator
    obs: NDArray[np.float32]  # [streams, OBS_DIM]
    masks: NDArray[np.bool_]  # [streams, A, P, C, K]
    default_t: NDArray[np.float64]  # [streams] NCCL default's mean time
    tier: float
    multi_node: bool
    cache: dict[tuple[int, ...], float]

    @classmethod
    def build(cls, job: Job, limits: ActionLimits, noise: NoiseModel) -> _Env:
        ctx = JobContext.of(job.features)
        sim = Simulator(ctx.system, noise=noise)
        coll = np.array([c.nccl_id for c, _ in job.streams])
        nbytes = np.array([float(n) for _, n in job.streams])
        obs, _ = encode_calls(ctx, sim.nccl, coll, nbytes)
        cons = limits.constraints()
        ap = np.stack([action_mask(ctx.system, c, cons) for c, _ in job.streams])
        pa, pp, pk, _ = sim.nccl_pick(coll, nbytes)
        return cls(
            job=job,
            sim=sim,
            obs=obs,
            masks=joint_mask(ap, limits),
            default_t=sim.times(coll, nbytes, pa, pp, nch=pk),
            tier=job.features.topology.tier_max.level / 3.0,
            multi_node=ctx.system.physical_nodes > 1,
            cache={},
        )

    def mean_time(self, stream: int, action: tuple[int, ...]) -> float:
        key = (stream, *action)
        if key not in self.cache:
            coll, nbytes = self.job.streams[stream]
            a, p, c, k = action
            t = self.sim.times(
                coll.nccl_id, nbytes, a, p, nch=CHANNEL_OPTIONS[c], chunk=CHUNK_OPTIONS[k]
            )
            self.cache[key] = float(t[0])
        return self.cache[key]


@dataclass
class Rollout:
    """A batch of episodes as tensors [jobs, steps, ...]."""

    obs: torch.Tensor
    prev_action: torch.Tensor
    prev_reward: torch.Tensor
    masks: torch.Tensor
    actions: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor
    reward: torch.Tensor
    log_speedup: torch.Tensor  # log(t_default / t): the latency part alone
    advantage: torch.Tensor | None = None
    returns: torch.Tensor | None = None


def _noisy(mean: float, rng: np.random.Generator, noise: NoiseModel, multi: bool) -> float:
    s = noise.stddev
    t = mean * math.exp(rng.normal(0.0, s) - s * s / 2)
    if multi and noise.congestion_prob > 0 and rng.random() < noise.congestion_prob:
        t *= 1.0 + rng.random() * noise.congestion_max
    return t


def collect(
    net: PolicyNet,
    jobs: list[Job],
    cfg: PPOConfig,
    *,
    reward: RewardConfig,
    limits: ActionLimits,
    rng: np.random.Generator,
    gen: torch.Generator,
) -> Rollout:
    """Run one episode per job with the current policy (sampled actions)."""
    envs = [_Env.build(j, limits, cfg.noise) for j in jobs]
    n, t_len = len(envs), cfg.steps
    streams = np.stack([rng.integers(len(e.job.streams), size=t_len) for e in envs])
    obs = torch.from_numpy(np.stack([e.obs[streams[i]] for i, e in enumerate(envs)]))
    masks = torch.from_numpy(np.stack([e.masks[streams[i]] for i, e in enumerate(envs)]))
    prev_a = torch.full((n, t_len, 4), -1, dtype=torch.long)
    prev_r = torch.zeros(n, t_len)
    actions = torch.zeros(n, t_len, 4, dtype=torch.long)
    logp = torch.zeros(n, t_len)
    value = torch.zeros(n, t_len)
    rew = torch.zeros(n, t_len)
    lsp = torch.zeros(n, t_len)
    last: list[dict[int, tuple[int, ...]]] = [{} for _ in envs]
    state = None
    with torch.no_grad():
        for t in range(t_len):
            sl = slice(t, t + 1)
            h, state = net.trunk(obs[:, sl], prev_a[:, sl], prev_r[:, sl], state)
            h = h[:, 0]
            step = net.act(h, masks[:, t], generator=gen)
            greedy = net.act(h, masks[:, t], greedy=True).actions
            actions[:, t], logp[:, t], value[:, t] = step.actions, step.log_prob, net.value_of(h)
            for i, e in enumerate(envs):
                s = int(streams[i, t])
                act = tuple(int(x) for x in step.actions[i].tolist())
                measured = _noisy(e.mean_time(s, act), rng, cfg.noise, e.multi_node)
                slow = math.log(measured / e.default_t[s])
                r = -reward.latency * slow
                if s in last[i] and last[i][s] != act:
                    r -= reward.switching
                if act != tuple(int(x) for x in greedy[i].tolist()):
                    r -= reward.probing
                r -= reward.tier_penalty * e.tier * max(0.0, slow)
                last[i][s] = act
                rew[i, t] = r
                lsp[i, t] = -slow
            if t + 1 < t_len:
                prev_a[:, t + 1] = actions[:, t]
                prev_r[:, t + 1] = rew[:, t]
    return Rollout(obs, prev_a, prev_r, masks, actions, logp, value, rew, lsp)


def advantages(roll: Rollout, gamma: float, lam: float) -> None:
    """GAE(gamma, lambda) in place; episodes end after the last step."""
    n, t_len = roll.reward.shape
    adv = torch.zeros(n, t_len)
    gae = torch.zeros(n)
    for t in reversed(range(t_len)):
        nxt = roll.value[:, t + 1] if t + 1 < t_len else torch.zeros(n)
        delta = roll.reward[:, t] + gamma * nxt - roll.value[:, t]
        gae = delta + gamma * lam * gae
        adv[:, t] = gae
    roll.advantage = adv
    roll.returns = adv + roll.value


def update(
    net: PolicyNet,
    opt: torch.optim.Optimizer,
    roll: Rollout,
    cfg: PPOConfig,
    gen: torch.Generator,
) -> dict[str, float]:
    """PPO epochs over the rollout (minibatches of whole episodes)."""
    if roll.advantage is None or roll.returns is None:
        raise ValueError("call advantages() before update()")
    n = roll.obs.shape[0]
    adv_all = roll.advantage
    adv_all = (adv_all - adv_all.mean()) / (adv_all.std() + 1e-8)
    stats = {"loss_pi": 0.0, "loss_v": 0.0, "entropy": 0.0, "clip_frac": 0.0}
    count = 0
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, cfg.minibatch_jobs):
            idx = perm[start : start + cfg.minibatch_jobs]
            h, _ = net.trunk(roll.obs[idx], roll.prev_action[idx], roll.prev_reward[idx])
            flat_h = h.reshape(-1, h.shape[-1])
            step = net.act(
                flat_h, roll.masks[idx].flatten(0, 1), actions=roll.actions[idx].flatten(0, 1)
            )
            old = roll.log_prob[idx].flatten()
            adv = adv_all[idx].flatten()
            ratio = torch.exp(step.log_prob - old)
            surr = torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
            loss_pi = -surr.mean()
            v = net.value_of(flat_h)
            loss_v = ((v - roll.returns[idx].flatten()) ** 2).mean()
            ent = step.entropy.mean()
            loss = loss_pi + cfg.value_coef * loss_v - cfg.entropy_coef * ent
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.max_grad_norm)
            opt.step()
            stats["loss_pi"] += float(loss_pi.detach())
            stats["loss_v"] += float(loss_v.detach())
            stats["entropy"] += float(ent.detach())
            stats["clip_frac"] += float(((ratio - 1).abs() > cfg.clip).float().mean())
            count += 1
    return {k: v / max(count, 1) for k, v in stats.items()}

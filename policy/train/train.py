"""`dynamiccl train`: the curriculum (single node -> rack -> multi-tier), seeded.

For each curriculum stage: label calls of jobs from the stage's mix with the
simulator, take imitation steps towards the simulator's best configuration,
then PPO iterations on episodes of jobs from the same mix; evaluate on a fixed
held-out set of jobs after every stage. Optionally fine-tune on real
experience (`offline.py`). Everything random comes from the config's seed:
the same config gives the same weights (torch runs single-threaded and in
deterministic mode).

Metrics are namespaced: `train/...` (losses, rewards of the last stage),
`eval/...` (held-out jobs, greedy policy), `eval_deployed/...` (the same jobs,
the decisions `policy decide` and compile-to-table make: greedy unless leaving
NCCL's pick with low confidence), per stage as `stage/<name>/...`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dynamiccl.api.nccl import Proto
from dynamiccl.policy.eval.evaluate import Metrics, action_times, metrics
from dynamiccl.policy.runtime.encode import JobContext
from dynamiccl.policy.runtime.ranker import DEVIATE_CONFIDENCE
from dynamiccl.policy.runtime.space import ActionLimits, joint_mask
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.train.curriculum import STAGES, Job, sample_jobs, stage_mix
from dynamiccl.policy.train.dataset import Labelled, concat, label_calls
from dynamiccl.policy.train.imitation import ImitationConfig, train_imitation
from dynamiccl.policy.train.inference import Policy, new_policy
from dynamiccl.policy.train.offline import OfflineConfig
from dynamiccl.policy.train.ppo import PPOConfig, RewardConfig, advantages, collect, update


class StageConfig(BaseModel):
    """Budget of one curriculum stage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset_jobs: int = Field(default=400, ge=0, description="jobs labelled for imitation")
    imitation_steps: int = Field(default=1000, ge=0)
    ppo_iterations: int = Field(default=40, ge=0)


class TrainConfig(BaseModel):
    """A training run (YAML/JSON file for `dynamiccl train --config`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    threads: int = Field(default=1, ge=1, le=2)
    hidden: int = Field(default=128, ge=8, le=1024)
    calls_per_job: int = Field(default=32, ge=1)
    eval_jobs: int = Field(default=200, ge=1)
    members: int = Field(
        default=1, ge=1, le=5, description="seed ensemble size: seeds seed .. seed+members-1"
    )
    workers: int = Field(default=1, ge=1, le=8, description="members trained at once (processes)")
    deviate_confidence: float = Field(
        default=DEVIATE_CONFIDENCE,
        gt=0,
        le=1,
        description="the members' mean probability a decision needs to leave NCCL's pick",
    )
    stages: tuple[StageConfig, StageConfig, StageConfig] = (
        StageConfig(),
        StageConfig(),
        StageConfig(),
    )
    imitation: ImitationConfig = ImitationConfig()
    ppo: PPOConfig = PPOConfig()
    offline: OfflineConfig = Field(
        default=OfflineConfig(), description="the fine-tune on a store's experience (--from-store)"
    )
    reward: RewardConfig = RewardConfig(switching=0.01, tier_penalty=0.5)
    limits: ActionLimits = ActionLimits()


class ConfigError(ValueError):
    """A training config file is unreadable or invalid (the message names the field)."""


def load_config(path: Path) -> TrainConfig:
    """Read a YAML/JSON training config; ConfigError names the file and field."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(config)"
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None


def label_jobs(
    jobs: list[Job], rng: np.random.Generator, calls: int, limits: ActionLimits
) -> tuple[Labelled, list[Simulator]]:
    """Label each job's own streams plus `calls` random calls (all collectives, 8 B-16 GiB)."""
    parts, sims = [], []
    for i, job in enumerate(jobs):
        ctx = JobContext.of(job.features)
        sim = Simulator(ctx.system)
        coll = np.concatenate(
            [rng.integers(0, 5, calls), [c.nccl_id for c, _ in job.streams]]
        ).astype(np.int64)
        nbytes = np.concatenate(
            [np.round(2.0 ** rng.uniform(3, 34, calls)), [float(n) for _, n in job.streams]]
        )
        parts.append(label_calls(ctx, sim, coll, nbytes, limits=limits, job=i))
        sims.append(sim)
    return concat(parts), sims


def evaluate(
    policy: Policy,
    data: Labelled,
    sims: list[Simulator],
    limits: ActionLimits,
    *,
    guarded: bool = False,
    tau: float | None = None,
) -> Metrics:
    """Greedy (or deployed: confidence-guarded, `Policy.decide`) policy on labelled calls."""
    policy.net.eval()
    feasible = joint_mask(data.ap_mask, limits)
    if guarded:
        pick = np.stack([data.nccl_ap // len(Proto), data.nccl_ap % len(Proto)], 1)
        acts = policy.decide(data.obs, feasible, pick, tau)[0]
    else:
        acts = policy.greedy(data.obs, feasible)
    policy.net.train()
    return metrics(data, action_times(sims, data, acts))


def flat_metrics(prefix: str, m: Metrics) -> dict[str, float]:
    out = {}
    for k, v in m.model_dump().items():
        if v is not None:
            out[f"{prefix}/{k}"] = float(v)
    return out


def run(
    cfg: TrainConfig,
    *,
    init: Policy | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[Policy, dict[str, float], list[dict[str, Any]]]:
    """Train; returns the policy, final metrics and the per-stage history."""
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([cfg.seed, 0])
    gen = torch.Generator().manual_seed(cfg.seed)
    policy = init or new_policy(cfg.seed, cfg.hidden)
    policy.net.train()
    eval_jobs = sample_jobs(np.random.default_rng([cfg.seed, 1]), cfg.eval_jobs, [1.0, 1.0, 1.0])
    eval_data, eval_sims = label_jobs(
        eval_jobs, np.random.default_rng([cfg.seed, 2]), cfg.calls_per_job, cfg.limits
    )
    history: list[dict[str, Any]] = []
    final: dict[str, float] = {}
    opt = torch.optim.Adam(policy.net.parameters(), lr=cfg.ppo.lr)
    t0 = time.monotonic()
    for k, (stage, st) in enumerate(zip(STAGES, cfg.stages, strict=True)):
        mix = stage_mix(k)
        rec: dict[str, Any] = {"stage": stage.value}
        if st.dataset_jobs and st.imitation_steps:
            jobs = sample_jobs(rng, st.dataset_jobs, mix)
            data, _ = label_jobs(jobs, rng, cfg.calls_per_job, cfg.limits)
            icfg = cfg.imitation.model_copy(update={"steps": st.imitation_steps})
            losses = train_imitation(policy.net, data, icfg, limits=cfg.limits, gen=gen, rng=rng)
            rec["train/imitation_loss"] = float(np.mean(losses[-50:]))
            rec["train/imitation_calls"] = len(data)
        if st.ppo_iterations:
            m0 = evaluate(policy, eval_data, eval_sims, cfg.limits)
            rec.update(flat_metrics("eval_imitation", m0))
        rewards, speed, ent = [], [], []
        for _ in range(st.ppo_iterations):
            jobs = sample_jobs(rng, cfg.ppo.jobs, mix)
            roll = collect(
                policy.net, jobs, cfg.ppo, reward=cfg.reward, limits=cfg.limits, rng=rng, gen=gen
            )
            advantages(roll, cfg.ppo.gamma, cfg.ppo.lam)
            stats = update(policy.net, opt, roll, cfg.ppo, gen)
            rewards.append(float(roll.reward.mean()))
            speed.append(float(roll.log_speedup.mean()))
            ent.append(stats["entropy"])
        if rewards:
            rec["train/ppo_reward"] = float(np.mean(rewards[-10:]))
            rec["train/ppo_speedup"] = float(np.exp(np.mean(speed[-10:])))
            rec["train/ppo_entropy"] = float(np.mean(ent[-10:]))
        m = evaluate(policy, eval_data, eval_sims, cfg.limits)
        rec.update(flat_metrics("eval", m))
        m = evaluate(
            policy, eval_data, eval_sims, cfg.limits, guarded=True, tau=cfg.deviate_confidence
        )
        rec.update(flat_metrics("eval_deployed", m))
        rec["train/elapsed_s"] = round(time.monotonic() - t0, 1)
        history.append(rec)
        log(json.dumps(rec))
        for key, v in rec.items():
            if key != "stage":
                final[f"stage/{stage.value}/{key}"] = float(v)
    last = history[-1]
    final.update({k: float(v) for k, v in last.items() if k != "stage"})
    policy.meta = {
        "seed": cfg.seed,
        "config": cfg.model_dump(mode="json"),
        "metrics": {k: v for k, v in final.items() if not k.startswith("stage/")},
        "history": history,
    }
    return policy, final, history

"""A seed ensemble: the curriculum run once per seed, the members kept in one model.

`TrainConfig.members` networks are trained by `train.run` from seeds `seed`,
`seed + 1`, ... (each reproducible on its own), `workers` of them at once in
separate processes (one torch thread each, so the result does not depend on
how many run at once). The first member decides and ranks; the others are
its peers: leaving NCCL's (algorithm, protocol) needs the members' mean
probability of the new pair to reach the decision rule's confidence
(`decision_rule.pooled_pair`). The model's `eval_deployed/...` metrics are the
ensemble's deployed decisions on the first member's held-out jobs; every
member's own metrics (each member alone, at the same confidence) are kept in
the model's metadata (`members`).
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from dynamiccl.policy.train.curriculum import sample_jobs
from dynamiccl.policy.train.inference import Policy
from dynamiccl.policy.train.model import build
from dynamiccl.policy.train.train import TrainConfig, evaluate, flat_metrics, label_jobs, run

Trained = tuple[Policy, dict[str, float], list[dict[str, Any]]]


def _member(cfg_json: str, seed: int, init: dict[str, Any] | None) -> tuple[Any, ...]:
    """One member in a worker process: its weights, metadata, metrics and history."""
    cfg = TrainConfig.model_validate_json(cfg_json).model_copy(update={"seed": seed})
    parent = None
    if init is not None:
        net = build(init["config"])
        net.load_state_dict(init["state"])
        parent = Policy(net=net)
    policy, final, history = run(cfg, init=parent)
    return policy.net.config(), policy.net.state_dict(), policy.meta, final, history


def _from_parts(parts: tuple[Any, ...]) -> Trained:
    config, state, meta, final, history = parts
    net = build(config)
    net.load_state_dict(state)
    net.eval()
    return Policy(net=net, meta=meta), final, history


def _parents(init: Policy | None, members: int) -> list[Policy | None]:
    """Member i continues the parent's member i (the parent's first member if it has fewer)."""
    if init is None:
        return [None] * members
    nets = [init.net, *init.peers]
    return [Policy(net=nets[i] if i < len(nets) else nets[0]) for i in range(members)]


def train_members(
    cfg: TrainConfig, init: Policy | None, log: Callable[[str], None]
) -> list[Trained]:
    """Every member, in seed order (worker processes when `cfg.workers` > 1)."""
    seeds = [cfg.seed + i for i in range(cfg.members)]
    parents = _parents(init, cfg.members)
    if cfg.workers == 1 or cfg.members == 1:
        return [
            run(cfg.model_copy(update={"seed": s}), init=p, log=log)
            for s, p in zip(seeds, parents, strict=True)
        ]
    blobs = [
        None if p is None else {"config": p.net.config(), "state": p.net.state_dict()}
        for p in parents
    ]
    # spawn: a forked child would inherit torch's thread pools in an undefined state
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=ctx) as pool:
        futures = [
            pool.submit(_member, cfg.model_dump_json(), s, b)
            for s, b in zip(seeds, blobs, strict=True)
        ]
        out = []
        for s, fut in zip(seeds, futures, strict=True):
            out.append(_from_parts(fut.result()))
            log(json.dumps({"member_seed": s, **out[-1][1]}))
    return out


def assemble(members: list[Trained], cfg: TrainConfig) -> Trained:
    """One model: the first member deciding, the others as peers, metrics of the whole."""
    first, final, history = members[0]
    policy = Policy(
        net=first.net, meta=dict(first.meta), peers=tuple(m[0].net for m in members[1:])
    )
    for m in members:
        m[0].net.eval()
    if len(members) == 1:
        return policy, final, history
    jobs = sample_jobs(np.random.default_rng([cfg.seed, 1]), cfg.eval_jobs, [1.0, 1.0, 1.0])
    data, sims = label_jobs(
        jobs, np.random.default_rng([cfg.seed, 2]), cfg.calls_per_job, cfg.limits
    )
    deployed = flat_metrics("eval_deployed", evaluate(policy, data, sims, cfg.limits, guarded=True))
    policy.net.eval()  # `evaluate` leaves the network in training mode
    final = {**final, **deployed, "ensemble/members": float(len(members))}
    policy.meta["metrics"] = {k: v for k, v in final.items() if not k.startswith("stage/")}
    policy.meta["members"] = [
        {"seed": m[0].meta.get("seed"), "metrics": m[0].meta.get("metrics", {})} for m in members
    ]
    return policy, final, history


def train_ensemble(
    cfg: TrainConfig, *, init: Policy | None = None, log: Callable[[str], None] = lambda _: None
) -> Trained:
    """Train `cfg.members` members and assemble them (one member: exactly `train.run`)."""
    return assemble(train_members(cfg, init, log), cfg)

"""A policy model on held-out jobs: gains where NCCL is wrong vs losses where it is right.

Reproduce:  .venv/bin/python benchmarks/heldout_bench.py [--model M.pt] [--jobs 300]
            [--seed 7] [--set dev|training] [--json]

The jobs are sampled from all three curriculum stages with a seed no training
run uses (training draws its data from seed [0, 0] and its own evaluation
jobs from [seed, 1]), so this is a development set: the place to choose
training settings or the decision rule's confidence, never the benchmark
suite. `--set training` uses instead the held-out jobs seed 0's training run
evaluates on ([0, 1] / [0, 2], 200 jobs; never trained on by any member), a
second held-out set. For each confidence the decision rule could use (0 = the
greedy network), the deployed decisions are simulated and reported next to
NCCL's default and the oracle in the same run, for the model and, when it
has peers (a seed ensemble), for its first member alone.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dynamiccl.api.nccl import Proto
from dynamiccl.policy.eval.evaluate import action_times, metrics
from dynamiccl.policy.runtime.space import ActionLimits, joint_mask
from dynamiccl.policy.train.curriculum import sample_jobs
from dynamiccl.policy.train.inference import Policy
from dynamiccl.policy.train.train import label_jobs

TAUS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def _arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> dict[str, Any]:
    torch.set_num_threads(1)
    model = _arg("--model", "")
    jobs_n, seed = int(_arg("--jobs", "300")), int(_arg("--seed", "7"))
    streams = (seed, 101), (seed, 102)
    if _arg("--set", "dev") == "training":
        jobs_n, seed, streams = 200, 0, ((0, 1), (0, 2))
    pol = Policy.load(Path(model) if model else None)
    t0 = time.monotonic()
    jobs = sample_jobs(np.random.default_rng(streams[0]), jobs_n, [1.0, 1.0, 1.0])
    limits = ActionLimits()
    data, sims = label_jobs(jobs, np.random.default_rng(streams[1]), 32, limits)
    feasible = joint_mask(data.ap_mask, limits)
    pick = np.stack([data.nccl_ap // len(Proto), data.nccl_ap % len(Proto)], 1)
    rows = []
    members = [("model", pol)] + ([("first member", Policy(net=pol.net))] if pol.peers else [])
    for who, p in members:
        for tau in TAUS:
            acts = p.decide(data.obs, feasible, pick, tau)[0]
            m = metrics(data, action_times(sims, data, acts))
            rows.append({"policy": who, "tau": tau, **m.model_dump()})
    return {
        "model": model or "shipped default",
        "members": 1 + len(pol.peers),
        "model_tau": pol.tau,
        "jobs": jobs_n,
        "seed": seed,
        "calls": len(data),
        "seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    }


if __name__ == "__main__":
    out = main()
    if "--json" in sys.argv:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{out['model']} ({out['members']} members, decides at {out['model_tau']}): "
            f"{out['jobs']} jobs, {out['calls']} calls, seed {out['seed']}"
        )
        print("policy        tau   % oracle  >2% below  worst   differ x (oracle)")
        for r in out["rows"]:
            print(
                f"{r['policy']:<13} {r['tau']:<5} {r['oracle_fraction'] * 100:8.3f} "
                f"{r['below_default_2pct']:>10} "
                f"{r['worst_speedup']:6.3f}  {r['differ_speedup'] or 0:.3f} "
                f"({r['differ_oracle_speedup'] or 0:.3f}, {r['differ_calls']} calls)"
            )

"""The env-knob experiment's statistics: how fast it finds a real effect, how often it invents one.

Reproduce:  .venv/bin/python benchmarks/knob_experiment_bench.py [--seeds 30] [--jobs 300] [--json]

This measures the *procedure* (policy/online/knob_experiment.py: assignment, the
cross-job comparison, adoption), not any NCCL knob: no published measurement
gives one a real effect (docs/simulator.md §4), so the effects below are
hypotheses a fleet could hold. A policy declares NCCL_NTHREADS {256, 512}
(default 512) and NCCL_BUFFSIZE {4 MiB, 8 MiB} (default NCCL's own): 4 arms.
Jobs arrive one by one on one hardware cohort; each is assigned by `assign`
with the status as last published; its measured time in each of 6 buckets is
the arm's true factor x a per-job lognormal (3 %) x a per-bucket lognormal
(1 %); the loop re-evaluates every 5 jobs. Scenarios: one value 8 % faster,
no effect at all, one value 10 % slower. Baseline in the same run: every job
on the declared defaults; reported as the fleet's mean time relative to it,
plus jobs until the better arm is adopted and how often a wrong arm is.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Mapping
from typing import Any

from dynamiccl.api.knob_experiment import CohortExperiment
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.online import knob_experiment as kx

BUCKETS = [("allreduce", b, 64, 8) for b in (12, 16, 20, 24, 28)] + [("allgather", 24, 64, 8)]
TICK_EVERY = 5
SCENARIOS: dict[str, dict[str, float]] = {
    "one value 8 % faster": {"NCCL_NTHREADS=256": 0.92},
    "no effect": {},
    "one value 10 % slower": {"NCCL_BUFFSIZE=4194304,NCCL_NTHREADS=512": 1.10},
}


def _spec(percent: int) -> NCCLTuningPolicySpec:
    return NCCLTuningPolicySpec.model_validate(
        {
            "mode": "learned",
            "constraints": {
                "envKnobs": [
                    {"name": "NCCL_NTHREADS", "allowed": [256, 512], "default": 512},
                    {"name": "NCCL_BUFFSIZE", "allowed": [4 << 20, 8 << 20]},
                ]
            },
            "exploration": {"envKnobJobPercent": percent},
        }
    )


def run(percent: int, truth: Mapping[str, float], jobs: int, seed: int) -> dict[str, Any]:
    """One fleet history: the arms the jobs got, when (and what) was adopted."""
    spec = _spec(percent)
    cands = kx.arms(spec.constraints.env_knobs)
    rng = random.Random(seed)
    entry: CohortExperiment | None = None
    job_arm: dict[str, str] = {}
    rows: list[kx.JobBucketTime] = []
    factors: list[float] = []
    first_adopted: tuple[int, str] | None = None
    for i in range(jobs):
        uid = f"s{seed}-job{i}"
        got = kx.assign(spec, entry, "c-bench", uid)
        factor = truth.get(got.arm, 1.0)
        factors.append(factor)
        job_arm[uid] = got.arm
        noise = rng.lognormvariate(0.0, 0.03)
        for k, b in enumerate(BUCKETS):
            t = 20.0 * (k + 1) * factor * noise * rng.lognormvariate(0.0, 0.01)
            rows.append(kx.JobBucketTime(uid, b, 100, t))
        if (i + 1) % TICK_EVERY == 0:
            entry = kx.experiment("c-bench", "", cands, kx.evaluate(cands, job_arm, rows))
            if entry.adopted is not None and first_adopted is None:
                first_adopted = (i + 1, kx.arm_key(kx.arm_of(entry.adopted)))
    final = kx.arm_key(kx.arm_of(entry.adopted)) if entry and entry.adopted else None
    return {
        "relative_time": sum(factors) / len(factors),
        "relative_time_last_100": sum(factors[-100:]) / len(factors[-100:]),
        "first_adopted": first_adopted,
        "final_adopted": final,
        "arms": {r.state.value for r in (entry.arms if entry else [])},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = []
    for name, truth in SCENARIOS.items():
        best = min(truth, key=lambda k: truth[k]) if truth and min(truth.values()) < 1 else None
        for percent in (10, 25):
            runs = [run(percent, truth, args.jobs, s) for s in range(args.seeds)]
            adopted_at = [r["first_adopted"][0] for r in runs if r["first_adopted"]]
            wrong = sum(1 for r in runs if r["first_adopted"] and r["first_adopted"][1] != best)
            out.append(
                {
                    "scenario": name,
                    "explore_percent": percent,
                    "fleet_time_vs_defaults": statistics.mean(r["relative_time"] for r in runs),
                    "last_100_jobs_vs_defaults": statistics.mean(
                        r["relative_time_last_100"] for r in runs
                    ),
                    "runs_adopting": len(adopted_at),
                    "runs_adopting_a_wrong_arm": wrong,
                    "median_jobs_to_adoption": statistics.median(adopted_at)
                    if adopted_at
                    else None,
                    "runs": len(runs),
                }
            )
    if args.json:
        print(json.dumps({"jobs": args.jobs, "seeds": args.seeds, "results": out}, indent=2))
        return
    print(f"{args.jobs} jobs per history, {args.seeds} seeds; times relative to all-defaults")
    print(
        f"{'scenario':<24} {'explore':>7} {'fleet':>7} {'last100':>8} {'adopted':>8} "
        f"{'wrong':>6} {'jobs to adopt':>14}"
    )
    for r in out:
        jobs_to = r["median_jobs_to_adoption"]
        print(
            f"{r['scenario']:<24} {r['explore_percent']:>6}% {r['fleet_time_vs_defaults']:7.4f} "
            f"{r['last_100_jobs_vs_defaults']:8.4f} {r['runs_adopting']:>4}/{r['runs']:<3} "
            f"{r['runs_adopting_a_wrong_arm']:>6} {jobs_to if jobs_to is not None else '-':>14}"
        )


if __name__ == "__main__":
    main()

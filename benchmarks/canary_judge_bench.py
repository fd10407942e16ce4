"""The canary judge under repeated looks: wrong verdicts and time to a right one.

Reproduce:  .venv/bin/python benchmarks/canary_judge_bench.py [--histories N] [--jobs N] [--json]

The learning loop judges a canary again at every tick (operator/learning/promotion.py).
Each simulated history adds one canary job and one job of the promoted model
per look (per-job speedup noise: lognormal 3 %), judging after each pair until
a verdict or `--jobs` pairs. True canary effect: none, 5 % faster, 5 % slower.
Baseline in the same run: the previous rule, a fixed one-sided 95 % bound
(z = 1.645) at every look; the current rule's bound holds over all looks at
once (policy/online/sequential.py). Reported: the share of histories ending in each
verdict, and the median number of job pairs to the verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from typing import Any

from dynamiccl.operator.learning.promotion import Criteria, Verdict, judge
from dynamiccl.operator.store.summary import JobOutcome


def history(effect: float, criteria: Criteria, jobs: int, seed: int) -> tuple[Verdict, int]:
    rng = random.Random(seed)
    outs: list[JobOutcome] = []
    for i in range(jobs):
        for version, eff in (("canary", effect), ("promoted", 0.0)):
            speedup = math.exp(0.1 + eff + rng.gauss(0.0, 0.03))
            outs.append(JobOutcome(f"{version}-{i}", version, 1000, 1000.0, 1000.0 * speedup))
        j = judge(outs, canary="canary", baseline="promoted", criteria=criteria)
        if j.verdict is not Verdict.WAIT:
            return j.verdict, i + 1
    return Verdict.WAIT, jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rules = {"fixed 95 % bound (previous)": Criteria(fixed_z=1.645), "simultaneous": Criteria()}
    out: list[dict[str, Any]] = []
    for effect, name in ((0.0, "no difference"), (0.05, "5 % faster"), (-0.05, "5 % slower")):
        for rule, crit in rules.items():
            res = [history(effect, crit, args.jobs, s) for s in range(args.histories)]
            share = {v.value: sum(1 for r, _ in res if r is v) / len(res) for v in Verdict}
            decided = [n for r, n in res if r is not Verdict.WAIT]
            out.append(
                {
                    "canary": name,
                    "rule": rule,
                    **share,
                    "median_pairs_to_verdict": statistics.median(decided) if decided else None,
                }
            )
    if args.json:
        print(
            json.dumps({"histories": args.histories, "jobs": args.jobs, "results": out}, indent=2)
        )
        return
    print(f"{args.histories} histories, up to {args.jobs} job pairs, a look after every pair")
    print(f"{'canary':<14} {'rule':<28} {'promote':>8} {'rollback':>9} {'wait':>6} {'pairs':>6}")
    for r in out:
        pairs = r["median_pairs_to_verdict"]
        print(
            f"{r['canary']:<14} {r['rule']:<28} {r['promote']:8.3f} {r['rollback']:9.3f} "
            f"{r['wait']:6.3f} {pairs if pairs is not None else '-':>6}"
        )


if __name__ == "__main__":
    main()

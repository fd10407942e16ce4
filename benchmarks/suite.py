"""The benchmark suite: speedup vs NCCL's default and fraction of the oracle.

Reproduce:  .venv/bin/python benchmarks/suite.py [--budget 200] [--json]
            (same as `dynamiccl bench suite --out docs --json`)

Writes docs/suite_speedup.png and docs/suite_summary.png and prints the
per-topology table (static policy and policy + online tuner), the overall
geometric means, the "differ" subset (calls where NCCL's pick is > 1 % off
the simulated optimum) and whether the issue's targets are met. The baseline
in the same run is NCCL's own pick (speedup 1.0 by definition) and the oracle
(the best configuration under the simulator).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from dynamiccl.policy.eval.suite import render, run_suite
from dynamiccl.policy.train.inference import Policy

DOCS = Path(__file__).resolve().parents[1] / "docs"


def main() -> None:
    torch.set_num_threads(1)
    budget = 200
    if "--budget" in sys.argv:
        budget = int(sys.argv[sys.argv.index("--budget") + 1])
    start = time.perf_counter()
    report = run_suite(Policy.load(), budget=budget)
    elapsed = time.perf_counter() - start
    render(report, DOCS)
    if "--json" in sys.argv:
        doc = report.model_dump(mode="json")
        for t in doc["topologies"]:
            t.pop("calls")
        doc["elapsed_s"] = round(elapsed, 1)
        print(json.dumps(doc, indent=2))
    else:
        print(report.summary())
        print(f"({elapsed:.0f} s; plots in {DOCS})")


if __name__ == "__main__":
    main()

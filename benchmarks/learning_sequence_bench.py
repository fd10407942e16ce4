"""Cross-job learning on a harness-played cluster: jobs until a departure is found and adopted.

Reproduce:  .venv/bin/python benchmarks/learning_sequence_bench.py [--jobs 10] [--calls 100000]
            [--surface tree|slow-pick|none] [--seed 0] [--change-back-after N] [--json]

Runs `dynamiccl.demo.sequence.LearningSequence` (what is real and what stands
in: dynamiccl/demo/learning_run.py, harness_job.py): jobs of one hardware
class (4 x 8 H100, two racks) in a row; by default the surface departs from
the simulator (Tree 1.25x faster than Ring for all-reduce >= 32 MiB),
`--surface slow-pick` is issue 29's variant (NCCL's own pair 1.15x slower
than the best other pair at every channel count, all-reduce >= 32 MiB),
`--surface none` (or `--no-departure`) the negative case (the simulator's
surface: NCCL's pick is what the prior believes). One line per job, the
learning curve: model version (c = canary), its speedup over NCCL's default
(exploration excluded), whether its table runs what is faster in every
departed cell, exploratory calls and their cost in % of the job's collective
time, what its exploration found, what the loop did after it, how many
findings held after it (issue 29), whether its table left NCCL's pair anywhere.
The end: the class's status (cells measured / settled, departures, findings),
the registry, and the issue's figures: `every_job_from` (the first job from
which every job runs what is faster in every departed cell),
`finding_after_job` (the job after which findings held in every departed
cell), the speedups from `every_job_from` on, the exploration cost per job,
and `jobs_leaving_nccl` (the negative case: 0).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from dynamiccl.api.table import size_bucket
from dynamiccl.demo.learning_run import learning_of
from dynamiccl.demo.sequence import POLICY, LearningSequence, SequenceConfig
from dynamiccl.testing.surface import DEPARTURE_TREE, SLOW_PICK

SURFACES = {"tree": DEPARTURE_TREE, "slow-pick": SLOW_PICK, "none": None}


def _row(r: Any) -> dict[str, Any]:
    return {
        "job": r.index,
        "model": r.model_version,
        "canary": r.canary,
        "speedup": None if r.speedup is None else round(r.speedup, 4),
        "runs_departure": r.runs_departure,
        "leaves_nccl": r.leaves_nccl,
        "explored_calls": r.played.budget["exploration_calls"],
        "cost_percent": r.played.budget["exploration_cost_percent"],
        "stopped_exploring_at": r.played.stopped_exploring_at,
        "found": [
            f"{f['collective']}/b{f['sizeBucket']} {f['algo']}/{f['proto']} x{f['speedup']:.3f}"
            for f in r.found
        ],
        "events": r.events,
    }


def _holding(seq: LearningSequence) -> int:
    status = learning_of(seq.api, POLICY)
    cls = status.coverage(seq.hw_class) if status else None
    return len(cls.holding()) if cls else 0


def _figures(rows: list[dict[str, Any]], departed_cells: int) -> dict[str, Any]:
    """The issue's figures from the jobs' rows (see the module docstring)."""
    n = len(rows)
    every = next((i + 1 for i in range(n) if all(r["runs_departure"] for r in rows[i:])), None)
    held = next((r["job"] for r in rows if r["findings_holding"] >= departed_cells), None)
    costs = [r["cost_percent"] for r in rows]
    return {
        "every_job_from": every if departed_cells else None,
        "finding_after_job": held if departed_cells else None,
        "speedups_from_then": [r["speedup"] for r in rows[(every or n + 1) - 1 :]],
        "cost_percent_per_job": costs,
        "mean_cost_percent": round(sum(costs) / max(n, 1), 4),
        "max_cost_percent": max(costs),
        "jobs_leaving_nccl": sum(r["leaves_nccl"] for r in rows),
    }


def _changed_back(rows: list[dict[str, Any]], after: int) -> dict[str, Any]:
    """With the surface changed back after job `after`: the jobs after it that still ran the
    old finding (goal: none later than 2 jobs after the change)."""
    if not after:
        return {}
    return {
        "changed_back_after_job": after,
        "jobs_after_change_running_it": [r["job"] for r in rows[after:] if r["runs_departure"]],
        "jobs_after_change_leaving_nccl": [r["job"] for r in rows[after:] if r["leaves_nccl"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--surface", choices=sorted(SURFACES), default="tree")
    ap.add_argument("--no-departure", action="store_true", help="the same as --surface none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--change-back-after", type=int, default=0,
        help="after this job the surface is the simulator's again (a finding stops holding)",
    )  # fmt: skip
    ap.add_argument(
        "--confirm-jobs", type=int, default=2,
        help="the policy's exploration.confirmJobs (100: no finding holds; only models adopt)",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    departure = None if args.no_departure else SURFACES[args.surface]
    cfg = SequenceConfig(
        calls=args.calls, seed=args.seed, departure=departure, confirm_jobs=args.confirm_jobs
    )
    departed = len({size_bucket(n) for c, n in cfg.step if departure and departure.applies(
        c.nccl_id, n)})  # fmt: skip
    rows = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        seq = LearningSequence(Path(tmp), cfg)
        try:
            for i in range(args.jobs):
                if args.change_back_after and i == args.change_back_after:
                    seq.surface.departure = None  # what was faster is not any more
                row = _row(seq.run_job())
                row["findings_holding"] = _holding(seq)
                rows.append(row)
                if not args.json:
                    print(json.dumps(row), flush=True)
            status = learning_of(seq.api, POLICY)
            registry = [(m.version, m.status.value) for m in seq.registry.list()]
        finally:
            seq.close()
    cls = status.coverage(seq.hw_class) if status else None
    summary = {
        "departure": None if cfg.departure is None else cfg.departure.describe(),
        "seed": args.seed,
        "calls_per_job": args.calls,
        "seconds": round(time.monotonic() - t0),
        "cells_measured": cls.cells_measured if cls else 0,
        "cells_settled": cls.cells_settled if cls else 0,
        "departures": [d.model_dump(mode="json") for d in cls.departures] if cls else [],
        "findings": [f.model_dump(mode="json") for f in cls.findings] if cls else [],
        "retrain": status.retrain.model_dump(mode="json") if status and status.retrain else None,
        "registry": registry,
        **_figures(rows, departed),
        **_changed_back(rows, args.change_back_after),
    }
    if args.json:
        print(json.dumps({"jobs": rows, **summary}))
    else:
        print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

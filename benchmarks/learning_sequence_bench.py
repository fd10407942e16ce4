"""Cross-job learning on a harness-played cluster: jobs until a departure is found and adopted.

Reproduce:  .venv/bin/python benchmarks/learning_sequence_bench.py [--jobs 10] [--calls 100000]
            [--no-departure] [--seed 0] [--json]

Runs `dynamiccl.demo.sequence.LearningSequence` (what is real and what stands
in: dynamiccl/demo/learning_run.py, harness_job.py): jobs of one hardware
class (4 x 8 H100, two racks) in a row; by default the surface departs from
the simulator (Tree 1.25x faster than Ring for all-reduce >= 32 MiB),
`--no-departure` is the negative case (the simulator's surface: NCCL's pick is
what the prior believes). One line per job — the learning curve: model version
(c = canary), its speedup over NCCL's default (exploration excluded), whether
its table runs Tree in the departed cells, exploratory calls and their cost in
% of the job's collective time, what the job's exploration found, what the loop
did after it. The end: the hardware class's status (cells measured / settled,
departures found and adopted) and the registry.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from dynamiccl.demo.learning_run import learning_of
from dynamiccl.demo.sequence import POLICY, LearningSequence, SequenceConfig


def _row(r: Any) -> dict[str, Any]:
    return {
        "job": r.index,
        "model": r.model_version,
        "canary": r.canary,
        "speedup": None if r.speedup is None else round(r.speedup, 4),
        "runs_departure": r.runs_departure,
        "explored_calls": r.played.budget["exploration_calls"],
        "cost_percent": r.played.budget["exploration_cost_percent"],
        "stopped_exploring_at": r.played.stopped_exploring_at,
        "found": [
            f"{f['collective']}/b{f['sizeBucket']} {f['algo']}/{f['proto']} x{f['speedup']:.3f}"
            for f in r.found
        ],
        "events": r.events,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--no-departure", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cfg = SequenceConfig(calls=args.calls, seed=args.seed)
    if args.no_departure:
        cfg = SequenceConfig(calls=args.calls, seed=args.seed, departure=None)
    rows = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        seq = LearningSequence(Path(tmp), cfg)
        try:
            for _ in range(args.jobs):
                row = _row(seq.run_job())
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
        "calls_per_job": args.calls,
        "seconds": round(time.monotonic() - t0),
        "cells_measured": cls.cells_measured if cls else 0,
        "cells_settled": cls.cells_settled if cls else 0,
        "departures": [d.model_dump(mode="json") for d in cls.departures] if cls else [],
        "retrain": status.retrain.model_dump(mode="json") if status and status.retrain else None,
        "registry": registry,
        "max_cost_percent": max(r["cost_percent"] for r in rows),
    }
    if args.json:
        print(json.dumps({"jobs": rows, **summary}))
    else:
        print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

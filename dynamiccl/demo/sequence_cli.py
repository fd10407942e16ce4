"""`dynamiccl demo --jobs N`: the cross-job story — jobs in a row find a departure and adopt it.

Runs `sequence.LearningSequence` (a harness-played cluster: the real plugin,
sidecar pieces, ingest, store, learning loop and retraining; see
learning_run.py for the stand-ins) and prints one line per job: the model
version it got (c: canary), whether its table runs the departure, its speedup
over NCCL's default, its exploratory calls and their cost, what it found, and
what the learning loop did after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynamiccl.demo.sequence import LearningSequence, SequenceConfig

HEADER = (
    f"{'job':>3} {'model':<34} {'runs Tree':>9} {'speedup':>8} {'explored':>8} {'cost %':>7}"
    "  found / loop"
)


def line(r: Any) -> str:
    model = f"{r.model_version}{' (c)' if r.canary else ''}"
    speed = f"{r.speedup:.3f}" if r.speedup else "-"
    found = ", ".join(
        f"b{f['sizeBucket']} {f['algo']}/{f['proto']} x{f['speedup']:.2f}" for f in r.found
    )
    events = "; ".join(e.split(":")[0] for e in r.events)
    b = r.played.budget
    return (
        f"{r.index:>3} {model:<34} {'yes' if r.runs_departure else 'no':>9} {speed:>8} "
        f"{b['exploration_calls']:>8} {b['exploration_cost_percent']:>7.3f}"
        f"  {found}{' | ' if found and events else ''}{events}"
    )


def run(out: Path, jobs: int, calls: int, seed: int, echo: Any) -> None:
    """Play `jobs` jobs of `calls` calls each in `out` and echo the learning curve."""
    seq = LearningSequence(out, SequenceConfig(calls=calls, seed=seed))
    try:
        dep = seq.cfg.departure
        echo(
            f"surface: {dep.describe() if dep else 'the simulator'} (NCCL and the prior don't know)"
        )
        echo(HEADER)
        for _ in range(jobs):
            echo(line(seq.run_job()))
    finally:
        seq.close()

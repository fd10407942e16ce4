"""`dynamiccl demo --jobs N`: the cross-job story — jobs in a row find a departure and adopt it.

Runs `sequence.LearningSequence` (a harness-played cluster: the real plugin,
sidecar, ingest, store, learning loop and retraining; see learning_run.py for
the stand-ins) and prints one line per job (`story.format_row`: the model
version it got, whether its table runs the departure, its speedup over NCCL's
default, its exploratory calls and their cost, what it found, what the learning
loop did after it), then what the sequence shows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dynamiccl.demo.sequence import LearningSequence, SequenceConfig
from dynamiccl.demo.story import outcome, play


def run(out: Path, jobs: int, calls: int, seed: int, echo: Callable[[str], None]) -> None:
    """Play `jobs` jobs of `calls` calls each in `out` and echo the learning curve."""
    seq = LearningSequence(out, SequenceConfig(calls=calls, seed=seed))
    try:
        dep = seq.cfg.departure
        echo(
            f"surface: {dep.describe() if dep else 'the simulator'} (NCCL and the prior don't know)"
        )
        rows = play(seq, jobs, echo)
        faster = dep.faster.value if dep else ""
        res = outcome(rows, seq.learning(), lambda f: f["algo"] == faster)
        for line in res.lines(f"{faster or 'nothing'} measured faster", seq.cfg.budget_percent):
            echo(line)
    finally:
        seq.close()

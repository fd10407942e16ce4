"""`dynamiccl demo`: jobs in a row find where reality departs from NCCL's model, and adopt it.

Runs `sequence.LearningSequence` (a harness-played cluster: the real plugin, sidecar,
ingest, store, learning loop and retraining; learning_run.py and harness_job.py say what
stands in) and prints one line per job (`story.format_row`: the model version it got,
whether its table runs the departure, its speedup over NCCL's default, its exploratory
calls and their cost, what it found, what the learning loop did after it), then what the
sequence shows and how many of the store's rows the last retraining used.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Final

import typer

# What a sequence leaves in its directory (`LocalLoop`, `LearningSequence`): a new demo in the
# same directory starts without the last one's store, models and jobs.
_LEFT: Final = ("ingest", "jobs", "models", "operator")
_LEFT_FILES: Final = ("ca.crt", "retrain.log", "store.sqlite", "store.sqlite-wal",
                      "store.sqlite-shm", "token", "train.yaml")  # fmt: skip
FAST: Final = (4, 30_000)  # --fast: jobs, calls per job (what `make test` checks)


def _fresh(out: Path) -> None:
    for d in _LEFT:
        shutil.rmtree(out / d, ignore_errors=True)
    for f in _LEFT_FILES:
        (out / f).unlink(missing_ok=True)


def demo(
    out: Annotated[
        Path, typer.Option("--out", help="output directory (store, models, jobs, logs)")
    ] = Path("demo-out"),
    jobs: Annotated[int, typer.Option(min=1, help="jobs in a row")] = 6,
    calls: Annotated[int, typer.Option(min=1000, help="collective calls per job")] = 30_000,
    fast: Annotated[
        bool, typer.Option("--fast", help=f"{FAST[0]} jobs of {FAST[1]} calls (tests)")
    ] = False,
    seed: Annotated[int, typer.Option(min=0, help="seed of everything random")] = 0,
) -> None:
    """Jobs in a row on a simulated cluster learn what NCCL does not know: no Kubernetes, no
    GPU."""
    from dynamiccl.demo.sequence import LearningSequence, SequenceConfig  # noqa: PLC0415
    from dynamiccl.demo.story import outcome, play  # noqa: PLC0415
    from dynamiccl.operator.learning.learning_status import retrain_rows  # noqa: PLC0415

    if fast:
        jobs, calls = FAST
    _fresh(out)
    seq = LearningSequence(out, SequenceConfig(calls=calls, seed=seed))
    try:
        dep = seq.cfg.departure
        typer.echo(
            f"surface: {dep.describe() if dep else 'the simulator'} (NCCL and the prior don't know)"
        )
        rows = play(seq, jobs, typer.echo)
        faster = dep.faster.value if dep else ""
        res = outcome(rows, seq.learning(), lambda f: f["algo"] == faster)
        for line in res.lines(f"{faster or 'nothing'} measured faster", seq.cfg.budget_percent):
            typer.echo(line)
        used = retrain_rows(seq.registry.list()[-1])
        if used is not None:
            typer.echo(
                f"the last retraining (`dynamiccl train --from-store`, {used.model_version}) "
                f"used {used.rows_used} of the store's {used.rows_read} rows"
            )
        typer.echo(f"the store, the models and each job's files (ConfigMap, sidecar state): {out}")
    finally:
        seq.close()

"""`dynamiccl demo`: the whole loop on the embedded default (issue #8).

The command only parses options, shows progress (rich, on stderr) and prints
the result; the story itself is `dynamiccl.demo.pipeline`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any

import typer


class _RichUi:
    """Progress bars and step lines on stderr."""

    def __init__(self, console: Any) -> None:
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("collective calls"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}
        self.bar.start()

    def step(self, message: str) -> None:
        self.bar.console.print(f"[cyan]•[/cyan] {message}")

    def progress(self, label: str, done: int, total: int) -> None:
        if label not in self.tasks:
            self.tasks[label] = self.bar.add_task(label, total=total)
        self.bar.update(self.tasks[label], completed=done, total=total)

    def stop(self) -> None:
        self.bar.stop()


def _table(summary: Any, console: Any) -> None:
    from rich.table import Table  # noqa: PLC0415

    from dynamiccl.demo.report import table_lines  # noqa: PLC0415

    lines = table_lines(summary)
    table = Table(title="NCCL's default vs DynamICCL, per collective and size bucket")
    for i, head in enumerate(lines[0]):
        table.add_column(head, justify="left" if i in (0, 1, 2, 8) else "right")
    for row in lines[1:]:
        table.add_row(*row)
    console.print(table)
    console.print(
        f"speedup vs NCCL's default (geometric mean over buckets): run 1 "
        f"[bold]{summary.speedup_geomean_run1:.3f}x[/bold], run 2 "
        f"[bold]{summary.speedup_geomean:.3f}x[/bold]"
    )
    console.print(
        f"rewards sent {summary.rewards_sent}, stored {summary.rewards_ingested}; "
        f"model versions: {', '.join(summary.model_versions)}; canary: {summary.canary}"
    )
    console.print(f"plot: {summary.plot}\nreport: {summary.report}")


def demo(  # noqa: PLR0917 - typer maps parameters to options
    out: Annotated[
        Path, typer.Option("--out", help="output directory (report, plot, store, logs)")
    ] = Path("demo-out"),
    fast: Annotated[
        bool,
        typer.Option("--fast", help="shorter runs: 700 training steps instead of 1500 (tests)"),
    ] = False,
    model: Annotated[
        Path | None, typer.Option(help="model file to start from (default: the shipped model)")
    ] = None,
    steps: Annotated[
        int | None, typer.Option(min=10, help="training steps per run (default 1500, fast 700)")
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of everything random")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    jobs: Annotated[
        int,
        typer.Option(
            min=0,
            help="instead: N jobs in a row on a surface with a departure (cross-job learning)",
        ),
    ] = 0,
    calls: Annotated[int, typer.Option(min=1000, help="calls per job with --jobs")] = 100_000,
) -> None:
    """Run the whole loop on a simulated cluster: no Kubernetes, no GPU."""
    if jobs:
        from dynamiccl.demo import sequence_cli  # noqa: PLC0415

        sequence_cli.run(out, jobs, calls, seed, typer.echo)
        return
    from rich.console import Console  # noqa: PLC0415

    from dynamiccl.demo import pipeline as dp  # noqa: PLC0415
    from dynamiccl.demo.job import DemoJobError  # noqa: PLC0415
    from dynamiccl.demo.learning_run import DemoModelError  # noqa: PLC0415
    from dynamiccl.demo.run import DemoRunError  # noqa: PLC0415
    from dynamiccl.testing.kubelet import KubeletError  # noqa: PLC0415
    from dynamiccl.testing.sim_cluster import ClusterError  # noqa: PLC0415

    if model is not None and not model.is_file():
        typer.echo(f"dynamiccl demo: --model {model}: no such file", err=True)
        raise typer.Exit(code=2)
    if importlib.util.find_spec("matplotlib") is None:  # the report's plot, at the very end
        typer.echo(
            "dynamiccl demo: matplotlib is not installed; it draws the report's plot. "
            "Install the plots extra (pip install 'dynamiccl[plots]').",
            err=True,
        )
        raise typer.Exit(code=2)
    err = Console(stderr=True)
    ui = _RichUi(err)
    try:
        summary = dp.run_demo(
            dp.Options(out=out, fast=fast, model=model, seed=seed, steps=steps), ui
        )
    except (dp.DemoError, DemoModelError) as exc:  # what the user can fix: exit 2
        ui.stop()
        typer.echo(f"dynamiccl demo: {exc}", err=True)
        raise typer.Exit(code=2) from None
    except (DemoRunError, DemoJobError, KubeletError, ClusterError) as exc:
        ui.stop()
        typer.echo(f"dynamiccl demo failed: {exc}", err=True)
        raise typer.Exit(code=1) from None
    ui.stop()
    if as_json:
        typer.echo(summary.model_dump_json(indent=2))
    else:
        _table(summary, Console(width=max(Console().width, 118)))

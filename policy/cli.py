"""`dynamiccl sim|policy|bench|train` commands (policy issue #6)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynamiccl._stub import not_implemented

sim_app = typer.Typer(help="Simulator: predict collective times, calibrate on measurements.")
policy_app = typer.Typer(help="The learned policy's decisions.")
bench_app = typer.Typer(help="Benchmarks: online tuning against a surface, the suite.")


@sim_app.command("predict")
def sim_predict(  # noqa: PLR0917 - typer maps parameters to options
    topology: Annotated[Path, typer.Option(help="topology spec YAML (DESIGN.md §5)")],
    collective: Annotated[str, typer.Option(help="allreduce, allgather, reducescatter, ...")],
    nbytes: Annotated[int, typer.Option("--bytes", help="message size as nccl-tests reports it")],
    algo: Annotated[str | None, typer.Option(help="default: NCCL's own pick")] = None,
    proto: Annotated[str | None, typer.Option(help="default: NCCL's own pick")] = None,
    nchannels: Annotated[int | None, typer.Option(help="default: NCCL's channel count")] = None,
    chunk: Annotated[int | None, typer.Option(help="chunk bytes; default: NCCL's")] = None,
    harness: Annotated[str, typer.Option(help="nccl-tests | nccl-tests-graph | torch")] = (
        "nccl-tests"
    ),
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Predict time and bus bandwidth of a collective on a topology."""
    from dynamiccl.policy.sim_cli import predict_command  # noqa: PLC0415

    predict_command(
        topology=topology,
        collective=collective,
        nbytes=nbytes,
        algo=algo,
        proto=proto,
        nchannels=nchannels,
        chunk=chunk,
        harness=harness,
        as_json=as_json,
    )


@sim_app.command("calibrate")
def sim_calibrate(
    report: Annotated[bool, typer.Option(help="also refit leave-one-system-out")] = False,
    write: Annotated[bool, typer.Option(help="refit and rewrite data/sim_params.json")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Compare the simulator with the published measurements."""
    from dynamiccl.policy.sim_cli import calibrate_command  # noqa: PLC0415

    calibrate_command(report=report, write=write, as_json=as_json)


@policy_app.command("decide")
def policy_decide() -> None:
    """The learned choice for one collective call."""
    not_implemented("policy decide", 6)


@bench_app.command("tune")
def bench_tune() -> None:
    """Online tuning against a response surface."""
    not_implemented("bench tune", 6)


@bench_app.command("suite")
def bench_suite() -> None:
    """Speedup vs NCCL's default and vs the oracle over the suite."""
    not_implemented("bench suite", 6)


def train() -> None:
    """Train (or fine-tune) the policy."""
    not_implemented("train", 6)

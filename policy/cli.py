"""`dynamiccl sim|policy|bench|train` commands (policy issue #6)."""

from __future__ import annotations

import typer

from dynamiccl._stub import not_implemented

sim_app = typer.Typer(help="Simulator: predict collective times, calibrate on measurements.")
policy_app = typer.Typer(help="The learned policy's decisions.")
bench_app = typer.Typer(help="Benchmarks: online tuning against a surface, the suite.")


@sim_app.command("predict")
def sim_predict() -> None:
    """Predict time and bus bandwidth of a collective on a topology."""
    not_implemented("sim predict", 6)


@sim_app.command("calibrate")
def sim_calibrate() -> None:
    """Compare the simulator with the published measurements."""
    not_implemented("sim calibrate", 6)


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

"""`dynamiccl sim|policy|bench|train` commands (policy issue #6)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

sim_app = typer.Typer(help="Simulator: predict collective times, calibrate on measurements.")
policy_app = typer.Typer(help="The learned policy's decisions.")
bench_app = typer.Typer(help="Benchmarks: online tuning against a surface, the suite.")


@sim_app.command("predict")
def sim_predict(  # noqa: PLR0917 - typer maps parameters to options
    topology: Annotated[Path, typer.Option(help="topology spec YAML (docs/simulator.md)")],
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
    from dynamiccl.policy.cli.sim import predict_command  # noqa: PLC0415

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
    from dynamiccl.policy.cli.sim import calibrate_command  # noqa: PLC0415

    calibrate_command(report=report, write=write, as_json=as_json)


@policy_app.command("decide")
def policy_decide(  # noqa: PLR0917 - typer maps parameters to options
    topology: Annotated[Path, typer.Option(help="topology spec YAML (docs/simulator.md)")],
    collective: Annotated[str, typer.Option(help="allreduce, allgather, reducescatter, ...")],
    nbytes: Annotated[int, typer.Option("--bytes", help="message size as nccl-tests reports it")],
    job: Annotated[
        Path | None, typer.Option(help="the job's state features (YAML/JSON); default: none")
    ] = None,
    policy: Annotated[
        Path | None, typer.Option("--policy", help="NCCLTuningPolicy YAML (its constraints)")
    ] = None,
    model: Annotated[Path | None, typer.Option(help="model file; default: shipped")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """The learned choice for one collective call."""
    from dynamiccl.policy.cli.learn import decide_command  # noqa: PLC0415

    decide_command(
        topology=topology,
        job=job,
        collective=collective,
        nbytes=nbytes,
        policy_file=policy,
        model=model,
        as_json=as_json,
    )


@policy_app.command("communicators")
def policy_communicators(
    topology: Annotated[Path, typer.Option(help="topology spec YAML of the job's nodes")],
    parallelism: Annotated[
        str | None,
        typer.Option(
            help='the job\'s dynamiccl.io/parallelism annotation, e.g. "3d:tp=8,pp=4,dp=8"'
        ),
    ] = None,
    nodes: Annotated[int | None, typer.Option(help="nodes of the job; default: the spec's")] = None,
    job: Annotated[
        Path | None, typer.Option(help="the job's state features (YAML/JSON) instead")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Every communicator the job's parallelism implies, and whether its table covers it."""
    from dynamiccl.policy.cli.shapes import communicators_command  # noqa: PLC0415

    communicators_command(
        topology=topology, parallelism=parallelism, job=job, nodes=nodes, as_json=as_json
    )


@bench_app.command("tune")
def bench_tune(  # noqa: PLR0917
    surface: Annotated[Path, typer.Option(help="response surface CSV (docs/simulator.md)")],
    topology: Annotated[Path, typer.Option(help="topology spec YAML")],
    budget: Annotated[int, typer.Option(help="calls per (collective, nbytes)")],
    seed: Annotated[int, typer.Option(help="seed of exploration and measurement noise")] = 0,
    max_candidates: Annotated[
        int, typer.Option(help="configurations from the policy's prior (plus NCCL's pick)")
    ] = 8,
    model: Annotated[Path | None, typer.Option(help="model file; default: shipped")] = None,
    peers: Annotated[
        bool,
        typer.Option(
            "--peers",
            help="also run NCCL's default, coordinate descent, UCB, uniform, the static policy",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Online tuning against a response surface."""
    from dynamiccl.policy.cli.learn import tune_command  # noqa: PLC0415

    tune_command(
        surface=surface,
        topology=topology,
        budget=budget,
        seed=seed,
        max_candidates=max_candidates,
        model=model,
        as_json=as_json,
        peers=peers,
    )


@bench_app.command("suite")
def bench_suite(
    out: Annotated[Path | None, typer.Option(help="write PNG plots into this folder")] = None,
    budget: Annotated[
        int, typer.Option(help="online-tuner calls per bucket (0: static policy only)")
    ] = 200,
    model: Annotated[Path | None, typer.Option(help="model file; default: shipped")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Speedup vs NCCL's default and vs the oracle over the suite."""
    from dynamiccl.policy.cli.learn import suite_command  # noqa: PLC0415

    suite_command(out=out, model=model, budget=budget, as_json=as_json)


def train(  # noqa: PLR0917
    out: Annotated[Path, typer.Option(help="write model.pt, metrics.json, manifest.json here")],
    config: Annotated[Path | None, typer.Option(help="training config YAML/JSON")] = None,
    from_store: Annotated[
        str | None, typer.Option(help="experience store URL (SQLite path or postgresql://)")
    ] = None,
    from_store_env: Annotated[
        str | None,
        typer.Option(
            metavar="VAR",
            help="read the store URL from this environment variable (keeps a password "
            "out of the command line)",
        ),
    ] = None,
    features: Annotated[
        Path | None, typer.Option(help="job uid -> state features (YAML/JSON) for the store")
    ] = None,
    version: Annotated[str | None, typer.Option(help="model version name")] = None,
    parent: Annotated[str | None, typer.Option(help="parent version (OUT/../PARENT)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Train (or fine-tune) the policy."""
    from dynamiccl.policy.cli.learn import train_command  # noqa: PLC0415

    if from_store_env is not None:
        if from_store is not None:
            raise typer.BadParameter("--from-store and --from-store-env exclude each other")
        from_store = os.environ.get(from_store_env) or None
        if from_store is None:
            raise typer.BadParameter(f"--from-store-env: ${from_store_env} is not set")
    train_command(
        config=config,
        from_store=from_store,
        features=features,
        out=out,
        version=version,
        parent=parent,
        as_json=as_json,
    )

"""The `dynamiccl` command line: one entry point composing every component.

Each component owns its commands (``<component>/cli.py``); this module only
mounts them. Component CLI modules keep heavy imports (torch, kopf) inside the
command bodies so ``dynamiccl --help`` stays fast.
"""

from __future__ import annotations

import importlib.util

import typer

from dynamiccl.node_agent import cli as node_agent_cli
from dynamiccl.operator import cli as operator_cli
from dynamiccl.policy.cli import app as policy_cli
from dynamiccl.sidecar import cli as sidecar_cli
from dynamiccl.sidecar import topo_file as sidecar_topo_file

app = typer.Typer(
    name="dynamiccl",
    help="DynamICCL: learned, cluster-wide NCCL tuning for Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# The demo plays NCCL through the test tools (dynamiccl.testing) against the plugin built in a
# source checkout; an installed dynamiccl ships neither the demo nor those tools.
NEEDS_CHECKOUT = (
    "the demo runs from a source checkout of DynamICCL (`make demo`): it plays NCCL through "
    "the test tools and the plugin built there, which an installed dynamiccl does not ship"
)


if all(importlib.util.find_spec(m) for m in ("dynamiccl.demo", "dynamiccl.testing")):
    from dynamiccl.demo import main as demo_cli

    app.command("demo")(demo_cli.demo)
else:

    @app.command(
        "demo",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def demo_needs_checkout() -> None:
        """Run the whole loop on a simulated cluster (from a source checkout: `make demo`)."""
        typer.echo(f"dynamiccl demo: {NEEDS_CHECKOUT}", err=True)
        raise typer.Exit(code=2)


app.add_typer(policy_cli.sim_app, name="sim")
app.add_typer(policy_cli.policy_app, name="policy")
app.add_typer(policy_cli.bench_app, name="bench")
app.command("train")(policy_cli.train)
app.command("discover")(node_agent_cli.discover)
app.command("node-agent")(node_agent_cli.node_agent)
app.command("inject")(operator_cli.inject)
app.command("operator")(operator_cli.operator)
app.command("sidecar")(sidecar_cli.sidecar)
app.command("topo-file")(sidecar_topo_file.topo_file)
app.command(
    "ingest",
    add_help_option=False,  # --help goes to the ingest's own parser, with every option
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)(operator_cli.ingest)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()

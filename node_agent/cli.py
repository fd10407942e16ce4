"""`dynamiccl discover` and `dynamiccl node-agent` (node_agent issue #3)."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from dynamiccl.constants import ENV_HOST_ROOT, ENV_KUBECONFIG, ENV_NODE_NAME


class SharpOverride(StrEnum):
    """`--sharp`: trust discovery, or override it like the node label does."""

    AUTO = "auto"
    TRUE = "true"
    FALSE = "false"


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=2)


def _root(root: Path | None) -> Path:
    chosen = root or Path(os.environ.get(ENV_HOST_ROOT, "/"))
    if not chosen.is_dir():
        raise _fail(f"--root: {chosen}: not a directory")
    return chosen


def _human(topo_json: dict[str, object]) -> str:
    spec = topo_json.get("spec")
    lines = [f"node {topo_json['nodeName']}  sources: {', '.join(topo_json['sources'])}"]  # type: ignore[arg-type]
    if isinstance(spec, dict):
        lines.append("spec: " + " ".join(f"{k}={v}" for k, v in spec.items()))
    else:
        lines.append(f"spec: unknown keys {topo_json.get('specUnknown')}")
    for c in topo_json.get("conditions", []):  # type: ignore[attr-defined]
        lines.append(f"  unknown {c['field']}: {c['reason']}: {c['message']}")
    return "\n".join(lines)


def discover(
    root: Annotated[
        Path | None, typer.Option("--root", help="host root to read (default /)")
    ] = None,
    node_name: Annotated[
        str | None, typer.Option("--node-name", help="name to report (default: hostname)")
    ] = None,
    sharp: Annotated[
        SharpOverride, typer.Option("--sharp", help="override SHARP capability")
    ] = SharpOverride.AUTO,
    nccl_xml: Annotated[
        Path | None, typer.Option("--nccl-xml", help="also write NCCL topology XML here")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Print this node's communication topology."""
    from dynamiccl.node_agent import nccl_xml as xml  # noqa: PLC0415
    from dynamiccl.node_agent.discover import discover as run  # noqa: PLC0415
    from dynamiccl.node_agent.hostroot import HostRoot  # noqa: PLC0415

    host = HostRoot(_root(root))
    override = None if sharp is SharpOverride.AUTO else sharp is SharpOverride.TRUE
    disc = run(host, name=node_name, sharp_override=override)
    if nccl_xml is not None:
        try:
            nccl_xml.write_text(xml.render(disc))
        except OSError as exc:
            raise _fail(f"--nccl-xml: {nccl_xml}: {exc.strerror}") from exc
    wire = disc.topology.wire()
    typer.echo(json.dumps(wire, indent=2) if as_json else _human(wire))


def node_agent(  # noqa: PLR0917 - typer options
    root: Annotated[
        Path | None, typer.Option("--root", help="host root mounted read-only (default /)")
    ] = None,
    node_name: Annotated[
        str | None, typer.Option("--node-name", help=f"node to publish (default ${ENV_NODE_NAME})")
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=1.0, help="seconds between discoveries")
    ] = 300.0,
    once: Annotated[bool, typer.Option("--once", help="one round, then exit")] = False,
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", help="kubeconfig (default: in-cluster)")
    ] = None,
    stable_rounds: Annotated[
        int, typer.Option("--stable-rounds", min=1, help="rounds a change must persist")
    ] = 2,
    nccl_xml: Annotated[
        Path | None, typer.Option("--nccl-xml", help="keep NCCL topology XML written here")
    ] = None,
    topo_file: Annotated[
        str,
        typer.Option(
            "--nccl-topo-file",
            help="publish NCCL's topology XML for the node's pods: off, auto or always",
        ),
    ] = "off",
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per round")] = False,
) -> None:
    """Run the node agent: discover periodically and publish to Kubernetes."""
    from dynamiccl.node_agent.agent_loop import AgentLoop  # noqa: PLC0415
    from dynamiccl.node_agent.hostroot import HostRoot  # noqa: PLC0415
    from dynamiccl.node_agent.kube import KubeAdapter  # noqa: PLC0415
    from dynamiccl.node_agent.topo_file import Mode  # noqa: PLC0415

    try:
        mode = Mode(topo_file)
    except ValueError:
        raise _fail(f"--nccl-topo-file: {topo_file!r}: not one of off, auto, always") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host = HostRoot(_root(root))
    name = node_name or os.environ.get(ENV_NODE_NAME) or socket.gethostname()
    config = kubeconfig or os.environ.get(ENV_KUBECONFIG)
    if config and not Path(config).is_file():
        raise _fail(f"--kubeconfig: {config}: no such file")
    try:
        api = KubeAdapter(config)
    except Exception as exc:  # the client raises many config error types
        raise _fail(f"kubeconfig: cannot load cluster configuration: {exc}") from exc
    loop = AgentLoop(
        api=api,
        host=host,
        node_name=name,
        stable_rounds=stable_rounds,
        nccl_xml_path=nccl_xml,
        topo_file_mode=mode,
    )
    while True:
        r = loop.round()
        if as_json:
            out = {"node": name, "writes": r.writes, "pending": r.pending, "error": r.error}
            typer.echo(json.dumps(out))
        if once:
            if r.error:
                raise _fail(f"node-agent: {r.error}")
            return
        time.sleep(interval)

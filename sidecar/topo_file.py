"""`dynamiccl topo-file`: the init step that gives a pod its node's NCCL topology file.

The job's ConfigMap (mounted read-only) holds each distinct topology file of the cluster
once (``nccl-topo-<sha256[:16]>.xml``) and ``nccl-topo-nodes.json.gz``, which node has which
(dynamiccl/api/topo_nodes.py; the operator copies them from the nodes' NodeTopology objects,
which only each node's agent may write: docs/security.md). This step, run before the
training containers, copies the file of the pod's node (downward API ``spec.nodeName``) to
the path the webhook set in ``NCCL_TOPO_FILE``. A node without a file gets none: NCCL then logs that
it could not open the file and detects the topology itself, as without the variable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from dynamiccl.api import topo_nodes
from dynamiccl.constants import ENV_NODE_NAME, TOPO_FILE_NODES_KEY


class TopoFileError(ValueError):
    """The job's ConfigMap names a file it cannot hold (never followed)."""


def choose(config_dir: Path, node: str) -> str | None:
    """The topology file of ``node`` from the mounted ConfigMap (``None``: it has none)."""
    try:
        blob = (config_dir / TOPO_FILE_NODES_KEY).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TopoFileError(f"{TOPO_FILE_NODES_KEY}: unreadable: {exc}") from exc
    try:
        key = topo_nodes.decode(blob).get(node)
    except topo_nodes.TopoNodesError as exc:
        raise TopoFileError(f"{TOPO_FILE_NODES_KEY}: {exc}") from exc
    if key is None:
        return None
    try:
        return (config_dir / key).read_text()
    except OSError as exc:
        raise TopoFileError(f"{key}: unreadable: {exc}") from exc


def install(config_dir: Path, node: str, out: Path) -> str:
    """Write ``node``'s file to ``out`` (atomically) and say what was done."""
    text = choose(config_dir, node)
    if text is None:
        return f"node {node}: no topology file; NCCL detects the topology itself"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return f"node {node}: topology file written to {out} ({len(text)} bytes)"


def topo_file(
    config_dir: Annotated[Path, typer.Option("--config-dir", help="the job's ConfigMap")],
    out: Annotated[Path, typer.Option("--out", help="where NCCL_TOPO_FILE points")],
    node: Annotated[
        str | None, typer.Option("--node", help=f"the pod's node (default ${ENV_NODE_NAME})")
    ] = None,
) -> None:
    """Copy the pod's node's NCCL topology file (an init step the webhook adds)."""
    name = node or os.environ.get(ENV_NODE_NAME, "")
    if not name:
        typer.echo(f"topo-file: no node name (--node or ${ENV_NODE_NAME})", err=True)
        raise typer.Exit(code=2)
    try:
        typer.echo(install(config_dir, name, out))
    except (TopoFileError, OSError) as exc:
        # Never block the pod: without the file NCCL detects the topology itself.
        typer.echo(f"topo-file: {exc}; NCCL detects the topology itself", err=True)

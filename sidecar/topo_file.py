"""`dynamiccl topo-file`: the init step that gives a pod its node's NCCL topology file.

The job's ConfigMap (mounted read-only) holds each distinct topology file of the cluster
once (``nccl-topo-<sha256[:16]>.xml``) and ``nccl-topo-nodes.json``, which node has which
(the operator copies them from the nodes' NodeTopology objects, which only each node's
agent may write: docs/security.md). This step, run before the training containers,
copies the file of the pod's node (downward API ``spec.nodeName``) to the path the
webhook set in ``NCCL_TOPO_FILE``. A node without a file gets none: NCCL then logs that
it could not open the file and detects the topology itself, as without the variable.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Final

import typer

from dynamiccl.constants import ENV_NODE_NAME, TOPO_FILE_KEY_PREFIX, TOPO_FILE_NODES_KEY

KEY_RE: Final = re.compile(re.escape(TOPO_FILE_KEY_PREFIX) + r"[0-9a-f]{16}\.xml")


class TopoFileError(ValueError):
    """The job's ConfigMap names a file it cannot hold (never followed)."""


def choose(config_dir: Path, node: str) -> str | None:
    """The topology file of ``node`` from the mounted ConfigMap (``None``: it has none)."""
    try:
        nodes = json.loads((config_dir / TOPO_FILE_NODES_KEY).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TopoFileError(f"{TOPO_FILE_NODES_KEY}: unreadable: {exc}") from exc
    if not isinstance(nodes, dict):
        raise TopoFileError(f"{TOPO_FILE_NODES_KEY}: not an object")
    key = nodes.get(node)
    if key is None:
        return None
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise TopoFileError(f"{TOPO_FILE_NODES_KEY}: node {node!r}: bad file key {key!r}")
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

"""The cluster's NCCL topology files, as keys of a tuned job's ConfigMap.

Each node's agent publishes its node's file in its NodeTopology's status (``ncclTopoFile``;
only that node's agent may write it: the chart's node-agent admission policy). The job's
ConfigMap carries every distinct file once, keyed by its digest (``data``), and which node
has which (``binaryData``, gzip: dynamiccl/api/topo_nodes.py); the pod's init step picks its
node's (sidecar/topo_file.py). The job's pods may run on any node, so every node with a file
is listed.

Bounded: files beyond ``MAX_DATA`` bytes in all (the files and the compressed map) are left
out, the files most nodes share first (a node left out runs on NCCL's own detection, as a
node without a file).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from pydantic import ValidationError

from dynamiccl.api import topo_nodes
from dynamiccl.api.node_topology import NcclTopoFile
from dynamiccl.constants import TOPO_FILE_KEY_PREFIX, TOPO_FILE_NODES_KEY

MAX_DATA: Final = 256 * 1024  # bytes of files and map in a job's ConfigMap (1 MiB in all)
log = logging.getLogger("dynamiccl.operator")


def node_files(node_topologies: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """node name -> its topology file, from NodeTopology objects (invalid ones skipped)."""
    out: dict[str, str] = {}
    for name, obj in sorted(node_topologies.items()):
        raw = (obj.get("status") or {}).get("ncclTopoFile")
        if raw is None:
            continue
        try:
            out[name] = NcclTopoFile.model_validate(raw).xml
        except ValidationError as exc:
            log.warning("NodeTopology %s: ncclTopoFile ignored: %s", name, exc)
    return out


def file_key(xml: str) -> str:
    """The ConfigMap key of one file (its content's digest: one key per distinct file)."""
    return f"{TOPO_FILE_KEY_PREFIX}{hashlib.sha256(xml.encode()).hexdigest()[:16]}.xml"


class TopoData(NamedTuple):
    """A job ConfigMap's topology keys: ``data`` (file key -> XML) and ``binary_data`` (the
    node map's key -> base64 of its gzip bytes, as the API carries ``binaryData``)."""

    data: dict[str, str]
    binary_data: dict[str, str]


NO_FILES: Final = TopoData({}, {})


def config_map_data(files: Mapping[str, str], max_bytes: int = MAX_DATA) -> TopoData:
    """The ConfigMap keys for ``files`` (node -> XML); `NO_FILES` when there are none."""
    by_key: dict[str, list[str]] = {}
    text: dict[str, str] = {}
    for node, xml in files.items():
        key = file_key(xml)
        by_key.setdefault(key, []).append(node)
        text[key] = xml
    data: dict[str, str] = {}
    nodes: dict[str, str] = {}
    blob = b""
    files_bytes = 0  # of the files kept so far (the map is measured compressed, whole)
    for key in sorted(by_key, key=lambda k: (-len(by_key[k]), k)):
        more = {**nodes, **dict.fromkeys(by_key[key], key)}
        more_blob = topo_nodes.encode(more)
        size = len(text[key].encode())
        if files_bytes + size + len(more_blob) > max_bytes:
            log.warning(
                "topology file %s of %d node(s) left out: over %d bytes",
                key,
                len(by_key[key]),
                max_bytes,
            )
            continue
        data[key] = text[key]
        files_bytes += size
        nodes, blob = more, more_blob
    if not nodes:
        return NO_FILES
    return TopoData(data, {TOPO_FILE_NODES_KEY: base64.b64encode(blob).decode()})

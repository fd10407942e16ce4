"""The cluster's NCCL topology files, as keys of a tuned job's ConfigMap.

Each node's agent publishes its node's file in its NodeTopology's status (``ncclTopoFile``;
only that node's agent may write it: the chart's node-agent admission policy). The job's
ConfigMap carries every distinct file once, keyed by its digest, and which node has which
(``nccl-topo-nodes.json``); the pod's init step picks its node's (sidecar/topo_file.py). The
job's pods may run on any node, so every node with a file is listed.

Bounded: files beyond ``MAX_DATA`` bytes in all are left out, the files most nodes share
first (a node left out runs on NCCL's own detection, as a node without a file).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

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


def config_map_data(files: Mapping[str, str], max_bytes: int = MAX_DATA) -> dict[str, str]:
    """The ConfigMap keys for ``files`` (node -> XML); ``{}`` when there are none."""
    by_key: dict[str, list[str]] = {}
    text: dict[str, str] = {}
    for node, xml in files.items():
        key = file_key(xml)
        by_key.setdefault(key, []).append(node)
        text[key] = xml
    data: dict[str, str] = {}
    nodes: dict[str, str] = {}
    used = 0
    for key in sorted(by_key, key=lambda k: (-len(by_key[k]), k)):
        cost = len(text[key].encode()) + sum(len(n) + len(key) + 6 for n in by_key[key])
        if used + cost > max_bytes:
            log.warning(
                "topology file %s of %d node(s) left out: over %d bytes",
                key,
                len(by_key[key]),
                max_bytes,
            )
            continue
        used += cost
        data[key] = text[key]
        nodes.update(dict.fromkeys(by_key[key], key))
    if nodes:
        data[TOPO_FILE_NODES_KEY] = json.dumps(dict(sorted(nodes.items())), separators=(",", ":"))
    return data

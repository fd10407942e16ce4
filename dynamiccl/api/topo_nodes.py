"""Which node has which NCCL topology file: the map a job's ConfigMap carries (issue 33).

The operator writes it (operator/controller/topo_files.py), the pod's init step reads it
(sidecar/topo_file.py). A job's pods may land on any node, so the map lists every node of
the cluster that has a file. As JSON (``{"<node>": "<file key>"}``) that is 40-60 bytes a
node: about 5 500 nodes filled the ConfigMap's 256 KiB budget, and at 12 500 nodes the
files were left out. The map is therefore stored gzip-compressed under ``binaryData``:
node names and the few distinct file keys repeat, so 12 500 nodes take about 30-35 KB
(measured in tests/unit/api/test_topo_nodes.py).

Decoding never trusts the bytes: the decompressed size is bounded (``MAX_MAP_BYTES``) and
every value must be a file key (``KEY_RE``), so a bad map cannot point the init step at
another file or exhaust its memory.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from collections.abc import Mapping
from typing import Any, Final

from dynamiccl.constants import TOPO_FILE_KEY_PREFIX, TOPO_FILE_NODES_KEY

KEY_RE: Final = re.compile(re.escape(TOPO_FILE_KEY_PREFIX) + r"[0-9a-f]{16}\.xml")
MAX_MAP_BYTES: Final = 32 << 20  # decompressed: ~250 000 nodes of 100-character names
_GZIP: Final = 16 + zlib.MAX_WBITS


class TopoNodesError(ValueError):
    """The map cannot be read (never followed)."""


def encode(nodes: Mapping[str, str]) -> bytes:
    """The map's gzip bytes (deterministic: sorted keys, no timestamp)."""
    raw = json.dumps(dict(sorted(nodes.items())), separators=(",", ":")).encode()
    co = zlib.compressobj(9, zlib.DEFLATED, _GZIP)
    return co.compress(raw) + co.flush()


def decode(blob: bytes) -> dict[str, str]:
    """node -> file key, from the map's bytes; `TopoNodesError` for anything else."""
    d = zlib.decompressobj(_GZIP)
    try:
        raw = d.decompress(blob, MAX_MAP_BYTES)
    except zlib.error as exc:
        raise TopoNodesError(f"not gzip: {exc}") from exc
    if d.unconsumed_tail:
        raise TopoNodesError(f"over {MAX_MAP_BYTES} bytes decompressed")
    if not d.eof:
        raise TopoNodesError("truncated")
    try:
        nodes = json.loads(raw)
    except ValueError as exc:
        raise TopoNodesError(f"not JSON: {exc}") from exc
    if not isinstance(nodes, dict):
        raise TopoNodesError("not an object")
    for node, key in nodes.items():
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise TopoNodesError(f"node {node!r}: bad file key {key!r}")
    return nodes


def of_config_map(obj: Mapping[str, Any]) -> dict[str, str]:
    """The map of a ConfigMap object as the API returns it (``binaryData`` is base64); ``{}``
    without one (what `kubectl get cm ... -o jsonpath` + ``base64 -d | gunzip`` shows)."""
    blob = (obj.get("binaryData") or {}).get(TOPO_FILE_NODES_KEY)
    if blob is None:
        return {}
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, TypeError) as exc:
        raise TopoNodesError(f"not base64: {exc}") from exc
    return decode(raw)

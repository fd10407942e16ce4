#!/usr/bin/env python3
"""Expand hack/nodes.yaml into Kubernetes v1 Node objects for kwok.

usage: gen_nodes.py [--kube-version v1.33.x] [nodes.yaml]  > nodes.json

Prints a v1 List (JSON) that `kubectl apply -f -` / `kubectl create -f -`
accepts. Tests import this module and call expand() to get the same nodes.
Needs PyYAML.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

DEFAULT_FILE = Path(__file__).with_name("nodes.yaml")
ACCELERATOR_LABEL = "network.topology.nvidia.com/accelerator"


def _str_map(m: dict[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (m or {}).items()}


def expand(path: str | Path = DEFAULT_FILE, kube_version: str = "") -> list[dict[str, Any]]:
    """Return the Node objects described by nodes.yaml, in file order."""
    spec = yaml.safe_load(Path(path).read_text())
    defaults = spec.get("defaults") or {}
    nodes: list[dict[str, Any]] = []
    seen: set[str] = set()
    index = 0
    for pool in spec["pools"]:
        for n in pool["nodes"]:
            name = n["name"]
            if name in seen:
                raise ValueError(f"duplicate node name {name!r} in {path}")
            seen.add(name)
            labels = _str_map(defaults.get("labels"))
            labels.update(_str_map(pool.get("labels")))
            if pool.get("nvlink") == "nvswitch":
                # one NVLink domain per 8-GPU HGX baseboard, i.e. per node
                labels[ACCELERATOR_LABEL] = f"nvl-{name}"
            labels.update(_str_map(n.get("labels")))
            labels["kubernetes.io/hostname"] = name
            annotations = _str_map(defaults.get("annotations"))
            annotations.update(_str_map(pool.get("annotations")))
            annotations.update(_str_map(n.get("annotations")))
            node_info = _str_map(defaults.get("nodeInfo"))
            # stable per-node identities, as a kubelet would report them
            node_info.setdefault("machineID", uuid.uuid5(uuid.NAMESPACE_DNS, name).hex)
            node_info.setdefault("systemUUID", str(uuid.uuid5(uuid.NAMESPACE_URL, name)).upper())
            node_info.setdefault("bootID", str(uuid.uuid5(uuid.NAMESPACE_OID, name)))
            node_info.setdefault("kubeProxyVersion", "")  # deprecated, required by the schema
            if kube_version:
                node_info["kubeletVersion"] = kube_version
            # Fake, never-routed address; only shows in the API objects.
            internal_ip = f"10.250.{index // 250}.{index % 250 + 1}"
            index += 1
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": labels, "annotations": annotations},
                    "spec": {},
                    "status": {
                        "capacity": _str_map(pool["capacity"]),
                        "allocatable": _str_map(pool.get("allocatable") or pool["capacity"]),
                        "nodeInfo": node_info,
                        "addresses": [
                            {"type": "InternalIP", "address": internal_ip},
                            {"type": "Hostname", "address": name},
                        ],
                    },
                }
            )
    return nodes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=str(DEFAULT_FILE))
    ap.add_argument("--kube-version", default="")
    args = ap.parse_args(argv)
    items = expand(args.file, args.kube_version)
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

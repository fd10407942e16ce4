"""The demo's simulated cluster: the Kubernetes objects a real cluster would hold.

Pure builders, no I/O. From an example topology spec (docs/simulator.md) and a
training-job manifest they produce what the operator would read from the API
server: Node objects (labels as GPU Feature Discovery and topograph publish
them), the NodeTopology objects our node agent writes, the Namespace, the job
with a uid, and the job's pods as the Kubeflow training operator creates them
(labels, controller ownerReference) and the scheduler binds them (`nodeName`:
pods fill nodes in order). The operator's own functions then turn these into
state features (`operator/controller/features.py`), exactly as in a cluster.
"""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.topology import TopologySpec
from dynamiccl.operator.controller import jobkinds

ZONE: Final = "us-east-1a"
LEAF: Final = "leaf-0"  # both nodes under one leaf switch: a rack


class ClusterError(ValueError):
    """The job does not fit the simulated cluster (the message says why)."""


def new_uid(rng: random.Random) -> str:
    """A random (seeded) RFC 4122 uid, as the API server assigns."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def node_name(spec: TopologySpec, i: int) -> str:
    """Name of the i-th node of the simulated cluster."""
    return f"{spec.name}-{i}"


def nodes(spec: TopologySpec) -> list[dict[str, Any]]:
    """One Node object per node of the topology, labelled as GFD / topograph / zone publish."""
    out = []
    for i in range(spec.nodes):
        name = node_name(spec, i)
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        c.NODE_LABEL_HOSTNAME: name,
                        c.NODE_LABEL_ZONE: ZONE,
                        c.NODE_LABEL_TOPO_LEAF: LEAF,
                        c.NODE_LABEL_GFD_PRODUCT: f"NVIDIA-{spec.gpu}-80GB-HBM3",
                        c.NODE_LABEL_GFD_COUNT: str(spec.gpus_per_node),
                    },
                },
                "status": {"capacity": {c.RESOURCE_GPU: str(spec.gpus_per_node)}},
            }
        )
    return out


def node_topologies(spec: TopologySpec) -> dict[str, dict[str, Any]]:
    """The NodeTopology object our node agent would publish for each node (by node name)."""
    out = {}
    for i in range(spec.nodes):
        name = node_name(spec, i)
        one = spec.model_copy(update={"nodes": 1, "name": name})
        out[name] = {
            "apiVersion": f"{c.GROUP}/{c.API_VERSION}",
            "kind": "NodeTopology",
            "metadata": {"name": name},
            "status": {"spec": one.model_dump(mode="json")},
        }
    return out


def namespace(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """The job's Namespace object."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": dict(labels)},
    }


def with_uid(obj: Mapping[str, Any], uid: str) -> dict[str, Any]:
    """A copy of an object as the API server stores it (uid set)."""
    out = copy.deepcopy(dict(obj))
    out.setdefault("metadata", {})["uid"] = uid
    return out


@dataclass(frozen=True)
class PodPlan:
    """One training pod: where it runs and which ranks it holds."""

    name: str
    uid: str
    role: str
    index: int
    node: str
    first_rank: int
    nproc: int


def _owner(job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pods(
    job: Mapping[str, Any], spec: TopologySpec, rng: random.Random
) -> tuple[list[dict[str, Any]], list[PodPlan]]:
    """The job's training pods, created from its (possibly mutated) templates and bound.

    Pods fill the nodes in order (as many per node as its GPUs allow);
    ClusterError if they do not fit.
    """
    shape = jobkinds.job_shape(job)
    per_node = spec.gpus_per_node // shape.gpus_per_pod if shape.gpus_per_pod else 1
    if per_node < 1:
        raise ClusterError(
            f"a pod asks for {shape.gpus_per_pod} GPUs, a node has {spec.gpus_per_node}"
        )
    if shape.replicas > per_node * spec.nodes:
        raise ClusterError(
            f"{shape.replicas} pods of {shape.gpus_per_pod} GPUs do not fit on "
            f"{spec.nodes} nodes of {spec.gpus_per_node} GPUs"
        )
    meta = job["metadata"]
    objs: list[dict[str, Any]] = []
    plans: list[PodPlan] = []
    for group in jobkinds.replica_groups(job):
        if not group.trains or group.template is None:
            continue
        for i in range(group.replicas):
            k = len(plans)
            name = f"{meta['name']}-{group.role.lower()}-{i}"
            uid = new_uid(rng)
            node = node_name(spec, k // per_node)
            template = copy.deepcopy(dict(group.template))
            pod_meta = template.get("metadata") or {}
            labels = {
                **(pod_meta.get("labels") or {}),
                c.LABEL_KUBEFLOW_JOB_NAME: meta["name"],
                c.LABEL_KUBEFLOW_REPLICA_TYPE: group.role.lower(),
                "training.kubeflow.org/replica-index": str(i),
            }
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    **pod_meta,
                    "name": name,
                    "namespace": meta["namespace"],
                    "uid": uid,
                    "labels": labels,
                    "ownerReferences": [_owner(job)],
                },
                "spec": {**(template.get("spec") or {}), "nodeName": node},
            }
            objs.append(pod)
            plans.append(
                PodPlan(
                    name, uid, group.role, i, node, k * shape.nproc_per_node, shape.nproc_per_node
                )
            )
    return objs, plans

"""Job + pods + nodes + NodeTopology objects → the job's state features.

Pure. Before the pods are scheduled the tiers are an estimate from the job's
shape (``scheduled: false``, ``tier_mix`` in ``unknown``); once every training
pod is bound, the tier of every rank pair is observed from the nodes' labels:
same node (NVLink/PCIe inside a node, or one multi-node NVLink domain), same
leaf switch (= rack), cross-rack within a zone, cross-zone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dynamiccl.api.features import (
    EnvironmentFeatures,
    StateFeatures,
    Tier,
    TierMix,
    TopologyFeatures,
)
from dynamiccl.api.topology import Fabric
from dynamiccl.operator.controller import jobkinds
from dynamiccl.operator.controller.annotations import JobAnnotations
from dynamiccl.operator.controller.nodes import NodeFacts, node_facts


class FeatureError(ValueError):
    """The job's features cannot be built; the message names the field."""


@dataclass(frozen=True)
class Built:
    """Features plus the facts they came from."""

    features: StateFeatures
    nodes: tuple[str, ...]  # distinct nodes of the training pods, sorted


def tier_between(a: NodeFacts, b: NodeFacts) -> Tier:
    """The tier two ranks on these nodes communicate over."""
    if a.name == b.name:
        return Tier.SAME_NODE
    if a.nvlink_domain and a.nvlink_domain == b.nvlink_domain:
        return Tier.SAME_NODE  # one multi-node NVLink domain (e.g. GB200 NVL72): NVLink tier
    if a.zone and b.zone and a.zone != b.zone:
        return Tier.CROSS_ZONE
    if a.leaf and b.leaf and a.leaf == b.leaf:
        return Tier.SAME_RACK
    return Tier.CROSS_RACK


def tier_mix(ranks_per_node: Mapping[str, int], facts: Mapping[str, NodeFacts]) -> TierMix:
    """Fraction of rank pairs per tier."""
    counts: Counter[Tier] = Counter()
    names = sorted(ranks_per_node)
    for i, a in enumerate(names):
        n = ranks_per_node[a]
        counts[Tier.SAME_NODE] += n * (n - 1) // 2
        for b in names[i + 1 :]:
            counts[tier_between(facts[a], facts[b])] += n * ranks_per_node[b]
    total = sum(counts.values())
    if total == 0:
        return TierMix()
    fr = {t.value: counts[t] / total for t in Tier}
    # Absorb float rounding into the largest share so the fractions sum to exactly 1.
    largest = max(fr, key=lambda k: fr[k])
    fr[largest] = 1.0 - sum(v for k, v in fr.items() if k != largest)
    return TierMix.model_validate(fr)


def _bound_pods(pods: Iterable[Mapping[str, Any]]) -> tuple[list[str], int]:
    """Node names of the training pods (one entry per pod) and how many are unbound."""
    bound: list[str] = []
    unbound = 0
    for pod in pods:
        if not jobkinds.trains(pod):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            bound.append(str(node))
        else:
            unbound += 1
    return bound, unbound


def build(
    job: Mapping[str, Any],
    annotations: JobAnnotations,
    *,
    pods: Sequence[Mapping[str, Any]] = (),
    nodes: Mapping[str, Mapping[str, Any]] | None = None,
    node_topologies: Mapping[str, Mapping[str, Any]] | None = None,
    cluster_nodes: Sequence[Mapping[str, Any]] = (),
) -> Built:
    """The job's state features.

    ``nodes``/``node_topologies`` are keyed by node name. ``cluster_nodes`` is a
    sample of the cluster's nodes used to describe the hardware before the pods
    are scheduled (the GPU nodes that could host the job).
    """
    try:
        shape = jobkinds.job_shape(job)
    except jobkinds.JobShapeError as exc:
        raise FeatureError(str(exc)) from exc
    topos = node_topologies or {}
    bound, unbound = _bound_pods(pods)
    scheduled = bool(bound) and unbound == 0 and len(bound) >= shape.replicas
    if scheduled:
        where = _placed(bound, shape, nodes or {}, topos)
    else:
        where = _planned(shape, cluster_nodes, topos)
    unknown = [*shape.unknown, *where.unknown, *(f"topology.{u}" for u in where.ref.unknown)]
    topo = _topology(
        where.ref,
        spanned=where.spanned,
        ranks_per_node=where.ranks_per_node,
        tier_max=where.tier_max,
        mix=where.mix,
        annotations=annotations,
        unknown=unknown,
    )
    node_gpus = where.ref.spec.gpus_per_node if "topology.gpus_per_node" not in unknown else 0
    env = EnvironmentFeatures(
        container_boundary=bool(node_gpus and 0 < shape.gpus_per_pod < node_gpus),
        node_gpus=min(node_gpus, 72),
        pods_per_node_max=where.pods_per_node,
    )
    try:
        features = StateFeatures(
            world_size=shape.world_size,
            gpus_per_pod=shape.gpus_per_pod,
            replicas=shape.replicas,
            nproc_per_node=shape.nproc_per_node,
            scheduled=scheduled,
            topology=topo,
            workload=annotations.workload,
            environment=env,
            unknown=sorted(set(unknown))[:64],
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise FeatureError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from exc
    return Built(features, where.node_names)


@dataclass(frozen=True)
class _Placement:
    """Where the job's ranks are (scheduled) or would be (planned from the cluster's nodes)."""

    ref: NodeFacts  # the node shape the features describe
    spanned: int
    ranks_per_node: int
    pods_per_node: int
    tier_max: Tier
    mix: TierMix
    node_names: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


def _placed(
    bound: Sequence[str],
    shape: jobkinds.JobShape,
    nodes: Mapping[str, Mapping[str, Any]],
    topos: Mapping[str, Mapping[str, Any]],
) -> _Placement:
    """Every pod is bound: the nodes they run on, measured."""
    facts = {
        n: node_facts(nodes.get(n, {"metadata": {"name": n}}), topos.get(n)) for n in set(bound)
    }
    ranks = Counter({n: k * shape.nproc_per_node for n, k in Counter(bound).items()})
    mix = tier_mix(ranks, facts)
    node_names = tuple(sorted(facts))
    return _Placement(
        ref=facts[node_names[0]],
        spanned=len(node_names),
        ranks_per_node=max(ranks.values()),
        pods_per_node=max(Counter(bound).values()),
        tier_max=max((t for t in Tier if mix.of(t) > 0), key=lambda t: t.level),
        mix=mix,
        node_names=node_names,
        unknown=("heterogeneous_nodes",) if len({f.spec.gpu for f in facts.values()}) > 1 else (),
    )


def _planned(
    shape: jobkinds.JobShape,
    cluster_nodes: Sequence[Mapping[str, Any]],
    topos: Mapping[str, Mapping[str, Any]],
) -> _Placement:
    """Not scheduled yet: the cluster's typical GPU node, packed as densely as the pods allow."""
    sample = [
        node_facts(n, topos.get(str((n.get("metadata") or {}).get("name")))) for n in cluster_nodes
    ]
    ref = _typical(sample)
    per_node = (
        max(ref.spec.gpus_per_node // max(shape.gpus_per_pod, 1), 1) if shape.gpus_per_pod else 1
    )
    pods_per_node = min(per_node, shape.replicas)
    spanned = math.ceil(shape.replicas / pods_per_node)
    ranks_per_node = pods_per_node * shape.nproc_per_node
    if spanned == 1:
        mix = TierMix()
    else:
        total = shape.world_size * (shape.world_size - 1) / 2
        same = spanned * ranks_per_node * (ranks_per_node - 1) / 2 / total
        mix = TierMix(same_node=same, cross_rack=1.0 - same)
    return _Placement(
        ref=ref,
        spanned=spanned,
        ranks_per_node=ranks_per_node,
        pods_per_node=pods_per_node,
        tier_max=Tier.SAME_NODE if spanned == 1 else Tier.CROSS_RACK,
        mix=mix,
        unknown=("tier_mix",),
    )


def _typical(sample: Sequence[NodeFacts]) -> NodeFacts:
    """The most common GPU node shape in a sample (or an all-unknown placeholder)."""
    gpu_nodes = [f for f in sample if "gpu" not in f.unknown or f.from_node_topology]
    if not gpu_nodes:
        return node_facts({"metadata": {"name": "unknown"}})
    common = Counter(f.spec.gpu for f in gpu_nodes).most_common(1)[0][0]
    return sorted((f for f in gpu_nodes if f.spec.gpu == common), key=lambda f: f.name)[0]


def _topology(
    ref: NodeFacts,
    *,
    spanned: int,
    ranks_per_node: int,
    tier_max: Tier,
    mix: TierMix,
    annotations: JobAnnotations,
    unknown: list[str],
) -> TopologyFeatures:
    spec = ref.spec
    fabric, nics, nic_gbps = spec.fabric, spec.nics_per_node, spec.nic_Gbps
    if spanned > 1 and (fabric is Fabric.NONE or nics == 0):
        fabric, nics, nic_gbps = Fabric.ETHERNET, 1, nic_gbps or 100.0
        unknown.append("topology.fabric")
    return TopologyFeatures(
        name=f"job-{spanned}x{ranks_per_node}",
        gpu=spec.gpu,
        gpus_per_node=min(max(ranks_per_node, 1), 72),
        nodes=max(spanned, 1),
        intra=spec.intra,
        nvlink_GBps=spec.nvlink_GBps,
        nvls=spec.nvls,
        pcie_gen=spec.pcie_gen,
        nics_per_node=nics,
        nic_Gbps=nic_gbps,
        fabric=fabric,
        sharp=spec.sharp and fabric is Fabric.INFINIBAND,
        tier_max=tier_max,
        tier_mix=mix,
        ina_active=annotations.ina_active,
        ccl_library=annotations.ccl,
    )

"""The simulated cluster's objects read, through the operator's own functions, as the topology."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dynamiccl.api.features import Tier
from dynamiccl.api.topology import TopologySpec
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import features
from dynamiccl.operator.controller.nodes import node_facts
from dynamiccl.operator.ingest.auth import job_from_owner_chain
from dynamiccl.testing.sim_cluster import (
    ClusterError,
    namespace,
    new_uid,
    node_topologies,
    nodes,
    pods,
    with_uid,
)


def test_node_facts_from_the_node_objects_are_the_topology(spec: TopologySpec) -> None:
    topo = node_topologies(spec)
    for node in nodes(spec):
        name = node["metadata"]["name"]
        facts = node_facts(node, topo[name])
        assert facts.from_node_topology
        assert facts.spec.model_dump(exclude={"name"}) == spec.model_copy(
            update={"nodes": 1}
        ).model_dump(exclude={"name"})
        labels_only = node_facts(node)  # without our node agent: GFD labels
        assert labels_only.spec.gpu == spec.gpu
        assert labels_only.spec.gpus_per_node == spec.gpus_per_node


def test_uids_are_seeded() -> None:
    assert new_uid(random.Random(1)) == new_uid(random.Random(1))
    assert new_uid(random.Random(1)) != new_uid(random.Random(2))


def test_pods_fill_nodes_in_order_with_training_operator_labels(
    spec: TopologySpec, job: dict[str, Any]
) -> None:
    rng = random.Random(0)
    owned = with_uid(job, new_uid(rng))
    objs, plans = pods(owned, spec, rng)
    assert [p.node for p in plans] == ["aws-p5-2node-0", "aws-p5-2node-1"]
    assert [p.first_rank for p in plans] == [0, 8]
    assert [p.nproc for p in plans] == [8, 8]
    for obj, plan in zip(objs, plans, strict=True):
        meta = obj["metadata"]
        assert meta["uid"] == plan.uid
        assert obj["spec"]["nodeName"] == plan.node
        assert meta["labels"]["training.kubeflow.org/job-name"] == "bert-finetune"
        got = job_from_owner_chain(meta["namespace"], obj, lambda *_: None, frozenset())
        assert got is not None
        assert (got.kind, got.name, got.uid) == (
            "PyTorchJob",
            "bert-finetune",
            owned["metadata"]["uid"],
        )


def test_features_from_the_bound_pods(spec: TopologySpec, job: dict[str, Any]) -> None:
    rng = random.Random(0)
    owned = with_uid(job, new_uid(rng))
    objs, _ = pods(owned, spec, rng)
    built = features.build(
        owned,
        job_annotations.parse(owned["metadata"]["annotations"]),
        pods=objs,
        nodes={n["metadata"]["name"]: n for n in nodes(spec)},
        node_topologies=node_topologies(spec),
    )
    f = built.features
    assert f.scheduled
    assert f.world_size == 16
    assert f.topology.nodes == 2
    assert f.topology.tier_max is Tier.SAME_RACK  # one leaf switch
    assert f.topology.fabric is spec.fabric
    assert f.unknown == []


def test_a_job_that_does_not_fit_is_refused(spec: TopologySpec, job: dict[str, Any]) -> None:
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 2  # 3 pods of 8 GPUs, 2 nodes
    with pytest.raises(ClusterError, match="do not fit"):
        pods(with_uid(job, "u"), spec, random.Random(0))
    for group in job["spec"]["pytorchReplicaSpecs"].values():
        group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 16
    with pytest.raises(ClusterError, match="asks for 16 GPUs"):
        pods(with_uid(job, "u"), spec, random.Random(0))


def test_namespace_object() -> None:
    ns = namespace("ml-team", {"team": "ml"})
    assert ns["metadata"] == {"name": "ml-team", "labels": {"team": "ml"}}

"""State features from a job, its pods and the kwok nodes' labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dynamiccl import constants as c
from dynamiccl.api.features import Parallelism, Tier
from dynamiccl.api.topology import Intra, TopologySpec
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import features

Job = Callable[..., dict[str, Any]]
Pods = Callable[[dict[str, Any], list[str | None]], list[dict[str, Any]]]


def _build(job: dict[str, Any], pods: list[dict[str, Any]], kwok: dict[str, Any]) -> Any:
    ann = job_annotations.parse(job["metadata"]["annotations"])
    return features.build(job, ann, pods=pods, nodes=kwok, cluster_nodes=list(kwok.values()))


def test_two_pods_same_rack(pytorchjob: Job, pods_on: Pods, kwok_nodes: dict[str, Any]) -> None:
    job = pytorchjob(workers=1)
    built = _build(job, pods_on(job, ["gpu-h100-00", "gpu-h100-01"]), kwok_nodes)
    f = built.features
    assert f.scheduled
    assert (f.world_size, f.replicas, f.nproc_per_node, f.gpus_per_pod) == (16, 2, 8, 8)
    assert f.topology.tier_max is Tier.SAME_RACK
    # 2 nodes × 8 ranks: 2·28 same-node pairs, 64 same-rack pairs, of 120.
    assert f.topology.tier_mix.same_node == pytest.approx(56 / 120)
    assert f.topology.tier_mix.same_rack == pytest.approx(64 / 120)
    assert (f.topology.gpu, f.topology.intra, f.topology.nodes) == ("H100", Intra.NVSWITCH, 2)
    assert not f.environment.container_boundary
    assert built.nodes == ("gpu-h100-00", "gpu-h100-01")
    assert isinstance(f.topology.spec(), TopologySpec)


def test_cross_rack_and_cross_zone(
    pytorchjob: Job, pods_on: Pods, kwok_nodes: dict[str, Any]
) -> None:
    job = pytorchjob(workers=2)
    f = _build(
        job, pods_on(job, ["gpu-h100-00", "gpu-h100-04", "gpu-h100-05"]), kwok_nodes
    ).features
    assert f.topology.tier_max is Tier.CROSS_RACK
    assert f.topology.tier_mix.cross_rack > 0
    f = _build(
        job, pods_on(job, ["gpu-h100-00", "gpu-h100-01", "gpu-a100-00"]), kwok_nodes
    ).features
    assert f.topology.tier_max is Tier.CROSS_ZONE
    assert "topology.heterogeneous_nodes" not in f.unknown
    assert "heterogeneous_nodes" in f.unknown


def test_container_boundary(pytorchjob: Job, pods_on: Pods, kwok_nodes: dict[str, Any]) -> None:
    job = pytorchjob(workers=1, gpus=4)
    f = _build(job, pods_on(job, ["gpu-h100-00", "gpu-h100-00"]), kwok_nodes).features
    assert f.environment.container_boundary
    assert f.environment.pods_per_node_max == 2
    assert f.topology.tier_max is Tier.SAME_NODE
    assert f.topology.nodes == 1


def test_unscheduled_job_is_estimated(
    pytorchjob: Job, pods_on: Pods, kwok_nodes: dict[str, Any]
) -> None:
    job = pytorchjob(workers=3)
    f = _build(job, pods_on(job, [None, None, "gpu-h100-00", None]), kwok_nodes).features
    assert not f.scheduled
    assert "tier_mix" in f.unknown
    assert f.topology.nodes == 4
    assert f.topology.tier_max is Tier.CROSS_RACK
    assert f.topology.gpu == "H100"  # most common GPU node in the cluster


def test_workload_annotations_flow_in(pytorchjob: Job, kwok_nodes: dict[str, Any]) -> None:
    job = pytorchjob(annotations={c.ANNOTATION_PARALLELISM: "fsdp", c.ANNOTATION_INA: "true"})
    f = _build(job, [], kwok_nodes).features
    assert f.workload.parallelism is Parallelism.FSDP
    assert f.topology.passthrough


def test_broken_job_raises_feature_error(kwok_nodes: dict[str, Any]) -> None:
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {}, "spec": {}}
    with pytest.raises(features.FeatureError, match="pytorchReplicaSpecs"):
        _build(job | {"metadata": {"annotations": {}}}, [], kwok_nodes)

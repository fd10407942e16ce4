"""Feasibility masks follow NCCL's rules; user constraints and passthrough."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.runtime.actions import (
    Constraints,
    action_mask,
    channel_choices,
    infeasible_reason,
    nccl_available,
    passthrough_reason,
)
from dynamiccl.policy.sim.calibration_data import calibration_system, load_system_specs
from dynamiccl.policy.sim.system import System, derive_spec, resolve

AR, AG, RS, BC = (
    Collective.ALLREDUCE,
    Collective.ALLGATHER,
    Collective.REDUCESCATTER,
    Collective.BROADCAST,
)


def system(**over: Any) -> System:
    """The 8x H200 calibration node (NVSwitch, NVLS, 8x 400G IB) with some keys changed."""
    return resolve(derive_spec(load_system_specs()["dgx-h200"], **over))


def ok(s: System, coll: Collective, algo: Algo, proto: Proto = Proto.SIMPLE) -> bool:
    return bool(nccl_available(s, coll)[algo.nccl_id, proto.nccl_id])


def test_nvls_needs_nvswitch_nvls_hopper_and_three_gpus() -> None:
    assert ok(system(), AR, Algo.NVLS)
    assert not ok(system(nvls=False), AR, Algo.NVLS)
    assert not ok(system(gpus_per_node=2), AR, Algo.NVLS)
    pcie = system(intra="pcie", nvlink_GBps=0, nvls=False)
    assert not ok(pcie, AR, Algo.NVLS)
    assert not ok(system(), AR, Algo.NVLS, Proto.LL)  # Simple only


def test_nvls_allgather_single_node_only_and_nvls_tree_multi_node_only() -> None:
    assert ok(system(), AG, Algo.NVLS)
    assert not ok(system(nodes=2), AG, Algo.NVLS)
    assert not ok(system(nodes=2), AR, Algo.NVLS)  # multi-node NVLS needs CollNet
    assert ok(system(nodes=2, sharp=True), AR, Algo.NVLS)
    assert not ok(system(), AR, Algo.NVLS_TREE)
    assert ok(system(nodes=2), AR, Algo.NVLS_TREE)


def test_collnet_only_with_sharp_multi_node_and_few_local_gpus() -> None:
    assert not ok(system(nodes=4), AR, Algo.COLLNET_DIRECT)
    assert ok(system(nodes=4, sharp=True), AR, Algo.COLLNET_DIRECT)
    assert ok(system(nodes=4, sharp=True), AR, Algo.COLLNET_CHAIN)
    assert not ok(system(sharp=True), AR, Algo.COLLNET_CHAIN)  # one node
    big = system(nodes=4, sharp=True, gpus_per_node=16)
    assert not ok(big, AR, Algo.COLLNET_DIRECT)
    nvlink = system(nodes=4, sharp=True, intra="nvlink", nvls=False)
    assert not ok(nvlink, AR, Algo.COLLNET_DIRECT)
    assert ok(nvlink, AR, Algo.COLLNET_CHAIN)


def test_pat_only_for_allgather_reducescatter_with_one_gpu_per_node() -> None:
    one = system(gpus_per_node=1, nodes=8, nvls=False)
    assert ok(one, AG, Algo.PAT)
    assert ok(one, RS, Algo.PAT)
    assert not ok(one, AR, Algo.PAT)
    assert not ok(one, AG, Algo.PAT, Proto.LL)
    assert not ok(system(nodes=8), AG, Algo.PAT)


def test_tree_only_for_allreduce_and_broadcast_only_ring() -> None:
    s = system(nodes=2)
    assert ok(s, AR, Algo.TREE, Proto.LL)
    for coll in (AG, RS, BC, Collective.REDUCE):
        assert not ok(s, coll, Algo.TREE)
    mask = nccl_available(s, BC)
    assert mask.sum() == 3
    assert mask[Algo.RING.nccl_id].all()


def test_ll128_needs_nvlink() -> None:
    pcie = system(gpu="L40S", intra="pcie", nvlink_GBps=0, nvls=False)
    assert not ok(pcie, AR, Algo.RING, Proto.LL128)
    assert ok(pcie, AR, Algo.RING, Proto.LL)
    assert ok(system(), AR, Algo.RING, Proto.LL128)


def test_efa_before_p5_runs_simple_only() -> None:
    p4d = system(gpu="A100", nvlink_GBps=300, nvls=False, nodes=2, fabric="efa", nics_per_node=4)
    mask = nccl_available(p4d, AR)
    assert not mask[:, Proto.LL.nccl_id].any()
    assert not mask[:, Proto.LL128.nccl_id].any()
    p5 = calibration_system("aws-p5-2node")
    assert nccl_available(p5, AR)[Algo.TREE.nccl_id, Proto.LL.nccl_id]


def test_single_rank_has_only_ring_simple() -> None:
    s = system(gpus_per_node=1, nvls=False, nics_per_node=0, nic_Gbps=0, fabric="none")
    assert nccl_available(s, AR).sum() == 1
    assert ok(s, AR, Algo.RING)


def test_user_constraints_narrow_the_mask() -> None:
    s = system()
    c = Constraints(algos=frozenset({Algo.RING}), protos=frozenset({Proto.SIMPLE, Proto.LL}))
    mask = action_mask(s, AR, c)
    assert mask.sum() == 2
    assert mask[Algo.RING.nccl_id, Proto.LL.nccl_id]
    assert channel_choices(Constraints(min_channels=4, max_channels=16)) == (4, 8, 12, 16)
    with pytest.raises(ValidationError, match="min_channels"):
        Constraints(min_channels=8, max_channels=4)
    with pytest.raises(ValidationError, match="algos"):
        Constraints(algos=frozenset())


def test_infeasible_reason_explains() -> None:
    s = system(gpu="L40S", intra="pcie", nvlink_GBps=0, nvls=False)
    reason = infeasible_reason(s, AR, Algo.NVLS, Proto.SIMPLE)
    assert reason is not None
    assert reason.startswith("nvls/simple unavailable for allreduce")
    assert infeasible_reason(s, AR, Algo.RING, Proto.SIMPLE) is None
    assert "nchannels" in (infeasible_reason(s, AR, Algo.RING, Proto.SIMPLE, nchannels=0) or "")
    only = Constraints(max_channels=8)
    r = infeasible_reason(s, AR, Algo.RING, Proto.SIMPLE, nchannels=16, constraints=only)
    assert r is not None
    assert "allowed range" in r


def test_passthrough() -> None:
    assert passthrough_reason() is None
    assert "not NCCL" in (passthrough_reason(ccl_library="rccl") or "")
    assert "in-network aggregation" in (passthrough_reason(in_network_aggregation=True) or "")

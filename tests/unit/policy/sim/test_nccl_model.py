"""NCCL's own cost model: picks, estimates and channel tuning."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import parse_topology
from dynamiccl.policy.sim.calibration_data import calibration_system
from dynamiccl.policy.sim.nccl_model import NcclModel
from dynamiccl.policy.sim.system import resolve
from tests.topology_samples import dgx_h100

AR = Collective.ALLREDUCE


def model(name: str) -> NcclModel:
    return NcclModel(calibration_system(name))


def test_8xh200_picks_ring_ll_up_to_1mib_and_nvls_from_2mib() -> None:
    # Row h200-ar-32k / h200-ar-2m notes (NCCL 2.27.7 on the measured node).
    m = model("dgx-h200")
    for size in (32 << 10, 256 << 10, 1 << 20):
        c = m.choose(AR, size)
        assert (c.algo, c.proto) == (Algo.RING, Proto.LL), size
    for size in (2 << 20, 64 << 20, 16 << 30):
        c = m.choose(AR, size)
        assert (c.algo, c.proto) == (Algo.NVLS, Proto.SIMPLE), size


def test_4_and_5_gpus_pick_ring_at_8gib() -> None:
    # Row h200x4-ar-8g: "NCCL picked Ring at 4 GPUs"; at 5 GPUs NCCL's model also
    # prefers Ring although NVLS measured faster (the nvls-small-team departure).
    for name in ("dgx-h200-4gpu", "dgx-h200-5gpu"):
        assert model(name).choose(AR, 8 << 30).algo is Algo.RING
    assert model("dgx-h200-6gpu").choose(AR, 8 << 30).algo is Algo.NVLS


def test_hand_computed_latency_and_bandwidth() -> None:
    m = model("dgx-h200")
    c, ring, nvls = AR.nccl_id, Algo.RING.nccl_id, Algo.NVLS.nccl_id
    ll, simple = Proto.LL.nccl_id, Proto.SIMPLE.nccl_id
    assert m.lat[c, ring, ll] == pytest.approx(6.6 + 14 * 0.6)  # base + 2(n-1) NVLink hops
    # NVLS: 8 channels x min(40 x .85 x 7/8 x 2, 60) GB/s, times nRanks/nsteps
    assert m.bw[c, nvls, simple] == pytest.approx(8 * min(40 * 0.85 * 7 / 8 * 2, 60) * 8 / 14)
    assert m.lat[c, nvls, simple] == pytest.approx(25.0)
    # Ring LL: min(llMaxBw 141, 12 x 30 x .5) x 8/14
    assert m.bw[c, ring, ll] == pytest.approx(141.0 * 8 / 14)


def test_estimate_of_the_pick_never_decreases_with_size() -> None:
    for name in ("dgx-h200", "aws-p5-2node", "azure-ndmv4-2node"):
        m = model(name)
        sizes = np.array([1 << k for k in range(0, 35)], dtype=np.float64)
        for coll in Collective:
            _, _, t = m.pick(np.full(sizes.shape, coll.nccl_id), sizes)
            assert np.all(np.diff(t) >= -1e-9), (name, coll)


def test_only_available_entries_are_finite() -> None:
    m = model("dgx-h200")
    t = m.times([Collective.BROADCAST.nccl_id], [1 << 20])[0]
    finite = {(a, p) for a in range(7) for p in range(3) if np.isfinite(t[a, p])}
    assert finite == {(Algo.RING.nccl_id, p) for p in range(3)}
    t = m.times([Collective.ALLGATHER.nccl_id], [1 << 20])[0]
    assert not np.isfinite(t[Algo.TREE.nccl_id]).any()
    assert np.isfinite(t[Algo.NVLS.nccl_id, Proto.SIMPLE.nccl_id])  # single-node NVLS AG


def test_channels_shrink_until_every_thread_has_work() -> None:
    m = model("dgx-h200")
    ring, ll = Algo.RING.nccl_id, Proto.LL.nccl_id
    sizes = np.array([32 << 10, 64 << 10, 256 << 10, 1 << 20])
    # Ring LL: 512 threads x threshold 8 x nRanks 8 = 32 KiB per channel, at most 24.
    assert m.channels(np.full(4, ring), np.full(4, ll), sizes).tolist() == [1, 2, 8, 24]
    nvls = Algo.NVLS.nccl_id
    assert m.channels([nvls], [Proto.SIMPLE.nccl_id], [1024]).tolist() == [16]


def test_single_rank_runs_ring_simple_for_free() -> None:
    spec: dict[str, Any] = {
        "name": "one",
        "gpu": "A100",
        "gpus_per_node": 1,
        "nodes": 1,
        "intra": "pcie",
        "nvlink_GBps": 0,
        "nvls": False,
        "pcie_gen": 4,
        "nics_per_node": 0,
        "nic_Gbps": 0,
        "fabric": "none",
        "sharp": False,
    }
    m = NcclModel(resolve(parse_topology(spec)))
    c = m.choose(AR, 1 << 20)
    assert (c.algo, c.proto, c.time_us) == (Algo.RING, Proto.SIMPLE, 0.0)


def test_multi_node_picks_tree_for_small_and_ring_or_nvls_tree_for_large() -> None:
    assert model("azure-ndmv4-2node").choose(AR, 8).algo is Algo.TREE
    assert model("azure-ndmv4-2node").choose(AR, 1 << 30).algo is Algo.RING
    assert model("aws-p5-2node").choose(AR, 1 << 30).algo is Algo.NVLS_TREE


def _dgx_h100(nodes: int) -> NcclModel:
    return NcclModel(resolve(parse_topology(dgx_h100("dgx-h100", nodes))))


def test_at_thousands_of_nodes_tree_latency_grows_with_log2_nodes_ring_with_nodes() -> None:
    """NCCL's latency terms (src/graph/tuning.cc) at 128 to 16 384 nodes: an AllReduce's Tree
    latency adds 2 inter-node hops per doubling of nodes, Ring's adds 2 per added node; so
    NCCL keeps Tree for a 1 MiB AllReduce and Ring's estimate runs away at 12 000 nodes."""
    ring, tree, simple = list(Algo).index(Algo.RING), list(Algo).index(Algo.TREE), 2
    lat = {n: _dgx_h100(n).times([AR.nccl_id], [1])[0] for n in (128, 256, 1024, 2048, 16384)}
    step_tree = lat[256][tree, simple] - lat[128][tree, simple]
    assert step_tree > 0
    assert lat[2048][tree, simple] - lat[1024][tree, simple] == pytest.approx(step_tree)
    assert lat[16384][tree, simple] - lat[128][tree, simple] == pytest.approx(7 * step_tree)
    per_node = (lat[256][ring, simple] - lat[128][ring, simple]) / 128
    assert per_node > 0
    assert (lat[2048][ring, simple] - lat[1024][ring, simple]) / 1024 == pytest.approx(per_node)
    assert (lat[16384][ring, simple] - lat[128][ring, simple]) / (16384 - 128) == pytest.approx(
        per_node
    )
    big = _dgx_h100(12000)
    assert big.choose(AR, 1 << 20).algo is Algo.TREE
    assert big.times([AR.nccl_id], [1 << 20])[0][ring, simple] > 1000 * lat[128][tree, simple]

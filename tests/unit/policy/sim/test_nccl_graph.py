"""NCCL's topology-search outcome, checked against published NCCL logs."""

from __future__ import annotations

from typing import Any

from dynamiccl.policy.sim.calibration_data import calibration_system, load_system_specs
from dynamiccl.policy.sim.nccl_graph import derive_graphs
from dynamiccl.policy.sim.system import System, derive_spec, resolve


def topo(**over: Any) -> System:
    """The 8x H200 calibration node with some keys changed."""
    return resolve(derive_spec(load_system_specs()["dgx-h200"], **over))


def test_hopper_single_node_matches_the_published_log() -> None:
    # NVIDIA/nccl#1197 (H100, NCCL 2.19): "Pattern 4, nChannels 12, bw 30/30" for the
    # ring and "Pattern 5, nChannels 8, bw 40/60" for NVLS.
    g = derive_graphs(calibration_system("dgx-h200"))
    assert (g.ring.n_channels, g.ring.bw_intra) == (12, 30.0)
    assert g.nvls is not None
    assert (g.nvls.n_channels, g.nvls.bw_intra, g.nvls.bw_inter) == (8, 40.0, 60.0)
    assert g.comm_channels == 24
    assert g.tree.tree_pattern  # Hopper: balanced tree degraded to tree


def test_nvls_channel_speed_shrinks_with_fewer_heads_sharing_the_link() -> None:
    speeds = {n: derive_graphs(calibration_system(f"dgx-h200-{n}gpu")).nvls for n in (4, 5, 6, 7)}
    assert all(v is not None for v in speeds.values())
    assert [speeds[n].bw_intra for n in (4, 5, 6, 7)] == [60.0, 60.0, 50.0, 40.0]  # type: ignore[union-attr]


def test_ampere_duplicates_six_40_gbps_channels() -> None:
    g = derive_graphs(calibration_system("azure-ndmv4-1node"))
    assert (g.ring.n_channels, g.ring.bw_intra) == (12, 20.0)
    assert g.nvls is None


def test_pcie_gen4_finds_two_channels() -> None:
    g = derive_graphs(
        topo(gpu="L40S", intra="pcie", nvlink_GBps=0, nvls=False, gpus_per_node=4, pcie_gen=4)
    )
    assert (g.ring.n_channels, g.ring.bw_intra) == (2, 12.0)
    assert not g.ring.nvlink


def test_multi_node_ring_uses_one_channel_per_nic() -> None:
    g = derive_graphs(calibration_system("azure-ndmv4-2node"))
    assert (g.ring.n_channels, g.ring.bw_inter) == (8, 24.0)
    assert g.nic_count == 8


def test_sharp_gives_a_collnet_graph() -> None:
    s = topo(nodes=4, nics_per_node=8, nic_Gbps=400, fabric="infiniband", sharp=True)
    assert derive_graphs(s).collnet is not None
    assert (
        derive_graphs(topo(nodes=4, nics_per_node=8, nic_Gbps=400, fabric="infiniband")).collnet
        is None
    )

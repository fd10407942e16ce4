"""Intra-node interconnect of the visible GPUs."""

from __future__ import annotations

from dynamiccl.api.node_topology import Gpu, NvLinkPeer, NvLinkRemote, PcieLink
from dynamiccl.api.topology import Intra
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.interconnect import analyse

SW = NvLinkRemote.NVSWITCH


def gpu(i: int, peers: list[NvLinkPeer] | None, cc: str = "9.0", visible: bool = True) -> Gpu:
    links = None if peers is None else sum(p.links for p in peers)
    return Gpu(
        bus_id=f"0000:{0x10 + i:02x}:00.0", visible=visible, compute_capability=cc,
        nvlink_links=links, nvlink_gbps=None if links is None else links * 25.0,
        nvlink_peers=peers or [], pcie=PcieLink(gen=5),
    )  # fmt: skip


def test_switch_with_hopper_has_nvls() -> None:
    gs = [gpu(i, [NvLinkPeer(remote=SW, links=18)]) for i in range(4)]
    ic = analyse(gs, 0, Conditions())
    assert (ic.intra, ic.nvlink_gbps, ic.nvswitch, ic.nvls, ic.pcie_gen) == (
        Intra.NVSWITCH,
        450.0,
        True,
        True,
        5,
    )
    assert ic.matrix.links[1] == [18, 0, 18, 18]


def test_ampere_switch_has_no_nvls_and_invisible_gpus_do_not_count() -> None:
    gs = [gpu(i, [NvLinkPeer(remote=SW, links=12)], cc="8.0") for i in range(2)]
    gs.append(gpu(2, None, visible=False))
    ic = analyse(gs, 6, Conditions())
    assert (ic.intra, ic.nvls, ic.nvlink_gbps) == (Intra.NVSWITCH, False, 300.0)
    assert ic.matrix.gpus == [gs[0].bus_id, gs[1].bus_id]


def test_one_gpu_without_links_makes_it_pcie() -> None:
    gs = [gpu(0, [NvLinkPeer(remote=SW, links=18)]), gpu(1, [])]
    ic = analyse(gs, 0, Conditions())
    assert (ic.intra, ic.nvlink_gbps, ic.nvls) == (Intra.PCIE, 0.0, False)


def test_unknown_links_leave_everything_unknown() -> None:
    conds = Conditions()
    ic = analyse([gpu(0, None), gpu(1, [NvLinkPeer(remote=SW, links=18)])], 0, conds)
    assert (ic.intra, ic.nvlink_gbps, ic.nvswitch, ic.nvls) == (None, None, None, None)
    assert [c.field for c in conds.items()] == ["intra"]


def test_no_visible_gpu() -> None:
    conds = Conditions()
    ic = analyse([gpu(0, None, visible=False)], 0, conds)
    assert ic.intra is None
    assert conds.items()[0].reason == "NoGpus"

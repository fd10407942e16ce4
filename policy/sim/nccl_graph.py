"""What NCCL's topology search would find: channels and per-channel bandwidth per algorithm.

NCCL's cost model (`ncclTopoTuneModel`) consumes, per algorithm, the graph its
topology search produced (`struct ncclTopoGraph`: nChannels, bwIntra, bwInter,
typeIntra, typeInter). We do not re-run the search on a real PCI tree; we
reproduce its outcome from the topology spec with the search's own rules
(NVIDIA/nccl `src/graph/search.cc`, NCCL 2.2x):

- candidate per-channel speeds come from `speedArrayIntra/Inter` (and the sm90 /
  sm100 arrays); the search starts at the first speed the system can carry,
  keeps the solution with the most `nChannels * bw`, stops when that equals the
  available bandwidth ("perfect" solution) or when the next speed falls below
  49 % of the best one found;
- `ncclTopoDupChannels` then doubles the channels and halves their bandwidth
  when `bwIntra >= 25` (on sm90+ only if `bwIntra >= 50` or nChannels <= 4);
- an NVLS channel has one head GPU that carries twice the traffic
  (`ncclTopoSearchTryNvls`), so with g GPUs the per-channel speed is the first
  speed <= bw / (g + 1), with g channels (checked against a published H100 log:
  "Pattern 5, nChannels 8, bw 40/60" with 360 GB/s NVLink, NVIDIA/nccl#1197);
- on Hopper+ the balanced tree pattern degenerates to a plain tree, which the
  cost model charges with `busBw *= .85`.

Several NICs per GPU (AWS p5: 32 x 100G for 8 GPUs) are counted as one fused NIC
per GPU, as NCCL's NIC fusion / the AWS plugin's grouping present them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from dynamiccl.policy.sim.hardware import Arch
from dynamiccl.policy.sim.system import System

SPEED_INTRA: Final = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEED_INTER: Final = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0)
SPEED_INTRA_SM90: Final = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SPEED_INTER_SM90: Final = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0)
SPEED_INTRA_SM100: Final = (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0)
SPEED_INTER_SM100: Final = (96.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0)
_TAIL: Final = (5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12)

MAX_CHANNELS: Final = 32  # MAXCHANNELS of the ring/tree graphs
NVLS_CHANNELS: Final = {Arch.HOPPER: 16, Arch.BLACKWELL: 24}  # NVLS_NCHANNELS_SM90 / SM100_NVL
NVLS_CHANNELS_MULTINODE_SM100: Final = 32


@dataclass(frozen=True)
class Graph:
    """One algorithm's search result (the fields `ncclTopoTuneModel` reads)."""

    n_channels: int
    bw_intra: float  # GB/s per channel
    bw_inter: float  # GB/s per channel
    nvlink: bool  # typeIntra == LINK_NVL (else PCI)
    tree_pattern: bool = False  # Hopper+: BALANCED_TREE degraded to TREE


@dataclass(frozen=True)
class Graphs:
    """The graphs of one communicator plus the channel counts NCCL derives."""

    ring: Graph
    tree: Graph
    nvls: Graph | None
    collnet: Graph | None
    comm_channels: int  # comm->nChannels used for ring/tree channel tuning
    nvls_channels: int  # comm->nvlsChannels
    nic_GBps: float  # noqa: N815 - NCCL's bandwidth of one (fused) NIC
    nic_count: int  # (fused) NICs per NCCL node


def _speeds(arch: Arch, inter: bool) -> tuple[float, ...]:
    if arch >= Arch.BLACKWELL:
        return (SPEED_INTER_SM100 if inter else SPEED_INTRA_SM100) + _TAIL
    if arch == Arch.HOPPER:
        return (SPEED_INTER_SM90 if inter else SPEED_INTRA_SM90) + _TAIL
    return (SPEED_INTER if inter else SPEED_INTRA) + _TAIL


def _search(
    speeds: tuple[float, ...], max_bw: float, total_bw: float, channels_at: Callable[[float], int]
) -> tuple[int, float]:
    """The search loop: best (nChannels, speed) by total bandwidth, NCCL's stop rules.

    `max_bw` is the fastest single path (`system->maxBw`, where the search
    starts), `total_bw` what a perfect solution carries (`system->totalBw`).
    """
    best_n, best_s = 0, 0.0
    for s in speeds:
        if s > max_bw + 1e-9:
            continue
        if best_n and s / best_s <= 0.49:
            break
        n = min(channels_at(s), MAX_CHANNELS // 2)
        if n > 0 and n * s > best_n * best_s + 1e-9:
            best_n, best_s = n, s
        if best_n and best_n * best_s >= total_bw - 1e-9:
            break
    if best_n == 0:  # NCCL falls back to one slow channel
        return 1, max(min(speeds[-1], max_bw), 0.1)
    return best_n, best_s


def _dup(n: int, bw: float, arch: Arch) -> tuple[int, float]:
    """`ncclTopoDupChannels`."""
    if bw < 25.0:
        return n, bw
    if arch >= Arch.HOPPER and bw < 50.0 and n > 4:
        return n, bw
    dup = min(2 * n, MAX_CHANNELS)
    return dup, bw / math.ceil(dup / n)


def derive_graphs(system: System) -> Graphs:
    """The graphs NCCL's search would produce for `system`."""
    arch = system.gpu.arch
    g = system.local_ranks
    intra = system.nccl_intra_GBps
    nvlink = system.nvlink
    nodes = system.nodes
    # NICs as NCCL sees them: fused to at most one per GPU of the NCCL node.
    if system.container_split:
        nic_count = max(1, min(system.nics, g)) if system.nics else 1
        per_nic = (
            system.net_node_GBps / system.containers_per_node / nic_count
            if system.nics
            else system.nccl_pcie_GBps / 2.0
        )
    else:
        nic_count = max(1, min(system.nics, g))
        per_nic = system.net_node_GBps / nic_count if system.nics else 0.0
    if nodes == 1:
        n, s = _search(_speeds(arch, False), intra, intra, lambda sp: math.floor(intra / sp + 1e-9))
        n, s = _dup(n, s, arch)
        ring = Graph(n, s, s, nvlink)
    else:
        net_cap = min(per_nic, system.nccl_pcie_GBps)

        def at(sp: float) -> int:
            return min(nic_count * math.floor(net_cap / sp + 1e-9), math.floor(intra / sp) + 1)

        n, s = _search(_speeds(arch, True), net_cap, min(net_cap * nic_count, intra), at)
        n, s = _dup(n, s, arch)
        ring = Graph(n, s, s, nvlink)
    tree = Graph(ring.n_channels, ring.bw_intra, ring.bw_inter, nvlink, arch >= Arch.HOPPER)
    nvls: Graph | None = None
    if system.spec.nvls and system.nvswitch and system.gpu.nvls_capable and g > 2:
        per = intra / (g + 1)
        s_intra = next((sp for sp in _speeds(arch, False) if sp <= per + 1e-9), 0.1)
        if nodes == 1:
            s_inter = _speeds(arch, False)[0]
        else:
            s_inter = next((sp for sp in _speeds(arch, True) if sp <= per_nic + 1e-9), 0.1)
        nvls = Graph(g, s_intra, s_inter, True)
    collnet: Graph | None = None
    if system.spec.sharp and nodes > 1:
        s_net = next((sp for sp in _speeds(arch, True) if sp <= per_nic + 1e-9), 0.1)
        collnet = Graph(nic_count, s_net, s_net, nvlink)
    if arch >= Arch.BLACKWELL:
        nvls_ch = NVLS_CHANNELS_MULTINODE_SM100 if nodes > 1 else NVLS_CHANNELS[Arch.BLACKWELL]
    else:
        nvls_ch = NVLS_CHANNELS[Arch.HOPPER]
    return Graphs(
        ring=ring,
        tree=tree,
        nvls=nvls,
        collnet=collnet,
        comm_channels=min(2 * min(ring.n_channels, tree.n_channels), MAX_CHANNELS),
        nvls_channels=nvls_ch,
        nic_GBps=per_nic,
        nic_count=nic_count,
    )

"""Fabric choice from NIC ports."""

from __future__ import annotations

from typing import Any

from dynamiccl.api.node_topology import Nic, NicKind
from dynamiccl.api.topology import Fabric
from dynamiccl.node_agent import netdev, nics, pci, rdma
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot


def choose(
    rows: list[tuple[str, NicKind, str | None, float | None]],
) -> tuple[nics.FabricChoice, list[str]]:
    conds = Conditions()
    ports = [
        Nic(name=n, kind=k, state=s, rate_gbps=r, port=None if k is NicKind.ETHERNET else 1)
        for n, k, s, r in rows
    ]
    choice, _ = nics._choose(ports, conds)
    return choice, [c.reason for c in conds.items()]


def test_ib_beats_efa_beats_roce_beats_ethernet() -> None:
    ib, roce, eth = NicKind.INFINIBAND, NicKind.ROCE, NicKind.ETHERNET
    c, _ = choose([("a", roce, "ACTIVE", 200.0), ("b", ib, "ACTIVE", 400.0), ("c", eth, "up", 1.0)])
    assert c == nics.FabricChoice(Fabric.INFINIBAND, 1, 400.0)
    c, _ = choose([("a", roce, "ACTIVE", 200.0), ("b", ib, "DOWN", 400.0)])
    assert c == nics.FabricChoice(Fabric.ROCE, 1, 200.0)
    c, _ = choose([("e1", eth, "up", 25.0), ("e2", eth, "up", 100.0), ("e3", eth, "up", 100.0)])
    assert c == nics.FabricChoice(Fabric.ETHERNET, 2, 100.0)
    assert choose([])[0] == nics.FabricChoice(Fabric.NONE, 0, 0.0)


def test_mixed_rates_take_the_slowest_and_say_so() -> None:
    ib = NicKind.INFINIBAND
    c, reasons = choose([("a", ib, "ACTIVE", 400.0), ("b", ib, "ACTIVE", 200.0)])
    assert c.nic_gbps == 200.0
    assert reasons == ["RatesDiffer"]


def test_unknowns_are_never_counted_as_known() -> None:
    ib, unk, eth = NicKind.INFINIBAND, NicKind.UNKNOWN, NicKind.ETHERNET
    c, _ = choose([("a", ib, "ACTIVE", 400.0), ("b", ib, None, 400.0)])
    assert (c.fabric, c.nics_per_node) == (Fabric.INFINIBAND, None)
    c, _ = choose([("a", ib, None, 400.0)])
    assert c.fabric is None
    c, _ = choose([("a", ib, "ACTIVE", 400.0), ("m", unk, "ACTIVE", None)])
    assert (c.fabric, c.nics_per_node) == (Fabric.INFINIBAND, None)
    # An unknown RDMA port could be InfiniBand, which would outrank RoCE.
    c, _ = choose([("a", NicKind.ROCE, "ACTIVE", 100.0), ("m", unk, "ACTIVE", None)])
    assert c.fabric is None
    c, _ = choose([("e", eth, "up", None)])
    assert (c.fabric, c.nic_gbps) == (Fabric.ETHERNET, None)


def test_build_on_a_fixture(fixture_root: Any) -> None:
    host = HostRoot(fixture_root("gb200-nvl72-tray"))
    out, choice = nics.build(pci.scan(host), rdma.scan(host), netdev.scan(host), Conditions())
    assert choice == nics.FabricChoice(Fabric.INFINIBAND, 4, 400.0)
    assert [(n.name, n.fabric_member, n.numa_node) for n in out][:2] == [
        ("mlx5_0", True, 0),
        ("mlx5_1", True, 0),
    ]
    assert {n.netdev for n in out if n.kind is NicKind.ROCE} == {"enP6p1s0f0np0", "enP6p1s0f1np1"}

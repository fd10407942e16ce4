"""RDMA ports: IB, RoCE and EFA as sysfs shows them."""

from __future__ import annotations

from typing import Any

from dynamiccl.node_agent import rdma
from dynamiccl.node_agent.hostroot import HostRoot


def test_ib_and_roce_ports(fixture_root: Any) -> None:
    ports = {p.device: p for p in rdma.scan(HostRoot(fixture_root("dgx-a100"))).ports}
    ib = ports["mlx5_0"]
    assert (ib.link_layer, ib.state, ib.phys_state, ib.rate_gbps) == (
        "InfiniBand",
        "ACTIVE",
        "LinkUp",
        200.0,
    )
    assert (ib.bus_id, ib.driver, ib.netdevs, ib.active) == (
        "0000:08:00.0",
        "mlx5_core",
        ["ibp8s0"],
        True,
    )
    down = ports["mlx5_5"]
    assert (down.link_layer, down.state, down.active) == ("Ethernet", "DOWN", False)


def test_efa_ports(fixture_root: Any) -> None:
    ports = rdma.scan(HostRoot(fixture_root("aws-p5"))).ports
    assert len(ports) == 32
    assert {(p.driver, p.link_layer, p.node_type, p.rate_gbps) for p in ports} == {
        ("efa", "Unknown", "unspecified", 100.0)
    }


def test_missing_ports_dir_is_a_problem(host_copy: Any) -> None:
    root = host_copy("gb200-nvl72-tray")
    target = (root / "sys/class/infiniband/mlx5_1").resolve() / "ports"
    for f in target.rglob("*"):
        if f.is_file():
            f.unlink()
    for d in sorted(target.rglob("*"), reverse=True):
        d.rmdir()
    target.rmdir()
    ports = [p for p in rdma.scan(HostRoot(root)).ports if p.device == "mlx5_1"]
    assert len(ports) == 1
    assert ports[0].problems[0].attr == "ports"
    assert ports[0].active is None


def test_no_rdma_stack_is_no_ports(fixture_root: Any) -> None:
    scan = rdma.scan(HostRoot(fixture_root("pcie-l40s")))
    assert scan.readable
    assert scan.ports == []

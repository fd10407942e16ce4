"""Physical netdevs only; a down link may hide its speed."""

from __future__ import annotations

from typing import Any

from dynamiccl.node_agent import netdev
from dynamiccl.node_agent.hostroot import HostRoot


def test_physical_netdevs(fixture_root: Any) -> None:
    devs = {d.name: d for d in netdev.scan(HostRoot(fixture_root("pcie-l40s"))).devices}
    assert sorted(devs) == ["eno1", "eno2", "ens1f0np0", "ens1f1np1"]  # lo is virtual
    up = devs["ens1f0np0"]
    assert (up.bus_id, up.driver, up.link_type, up.operstate, up.speed_mbps) == (
        "0000:41:00.0", "bnxt_en", 1, "up", 100000,
    )  # fmt: skip
    down = devs["eno2"]
    assert (down.operstate, down.speed_mbps, down.problems) == ("down", None, [])


def test_unreadable_speed_on_an_up_link_is_a_problem(host_copy: Any) -> None:
    root = host_copy("pcie-l40s")
    (root / "sys/class/net/ens1f1np1/speed").unlink()
    dev = next(d for d in netdev.scan(HostRoot(root)).devices if d.name == "ens1f1np1")
    assert [(p.attr, p.reason) for p in dev.problems] == [("speed", "Missing")]

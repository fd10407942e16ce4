"""Which recorded hosts publish an NCCL topology file, and what reaches the NodeTopology."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.node_topology import NodeTopology
from dynamiccl.node_agent import topo_file
from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot
from dynamiccl.node_agent.topo_file import Mode
from tests.unit.node_agent.conftest import LAYOUTS
from tests.unit.node_agent.test_agent_loop import MemoryApi, loop_for

# The README of tests/fixtures/hosts: AWS p5 hides its NVSwitches in the VM, a GB200 tray's
# NVSwitches are in the rack's switch trays; every other layout shows them on PCI, or has none.
HIDDEN_NVSWITCHES = {"aws-p5", "gb200-nvl72-tray"}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_auto_publishes_a_file_exactly_where_nvswitches_are_hidden(
    layout: str, fixture_root: Any
) -> None:
    disc = discover(HostRoot(fixture_root(layout)), name="gpu-1")
    topo = topo_file.with_file(disc, Mode.AUTO)
    assert (topo.nccl_topo_file is not None) == (layout in HIDDEN_NVSWITCHES)
    assert topo_file.with_file(disc, Mode.OFF).nccl_topo_file is None
    always = topo_file.with_file(disc, Mode.ALWAYS).nccl_topo_file
    assert always is not None
    root = ET.fromstring(always.xml)
    assert (root.tag, root.get("version"), root.get("name")) == ("system", "1", None)
    assert len(root.findall(".//gpu")) == len(disc.topology.gpus)


def test_hidden_nvswitch_file_names_the_far_end_an_nvswitch(fixture_root: Any) -> None:
    disc = discover(HostRoot(fixture_root("aws-p5")), name="p5-1")
    f = topo_file.with_file(disc, Mode.AUTO).nccl_topo_file
    assert f is not None
    assert "8 GPU(s)" in f.reason
    links = ET.fromstring(f.xml).findall(".//gpu/nvlink")
    assert links
    assert {(n.get("target"), n.get("tclass")) for n in links} == {("fffffff:ffff:ff", "0x068000")}


def test_nodes_of_one_layout_publish_identical_files(fixture_root: Any) -> None:
    host = HostRoot(fixture_root("aws-p5"))
    a = topo_file.with_file(discover(host, name="p5-a"), Mode.AUTO).nccl_topo_file
    b = topo_file.with_file(discover(host, name="p5-b"), Mode.AUTO).nccl_topo_file
    assert a is not None
    assert b is not None
    assert a.xml == b.xml


def test_the_loop_publishes_the_file_in_the_status_once(fixture_root: Any, tmp_path: Path) -> None:
    api = MemoryApi("gpu-1")
    loop = loop_for(fixture_root("aws-p5"), api, topo_file_mode=Mode.AUTO)
    assert loop.round().writes == 3
    status = api.objects["gpu-1"]["status"]
    assert status["ncclTopoFile"]["xml"].startswith('<system version="1">')
    assert NodeTopology.model_validate(status).nccl_topo_file is not None
    for _ in range(5):
        assert loop.round().writes == 0
    off = MemoryApi("gpu-1")
    loop_for(fixture_root("aws-p5"), off).round()
    assert off.objects["gpu-1"]["status"]["ncclTopoFile"] is None

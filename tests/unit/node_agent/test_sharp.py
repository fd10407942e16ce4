"""SHARP capability: override, evidence, fabric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynamiccl.api.topology import Fabric
from dynamiccl.node_agent import sharp
from dynamiccl.node_agent.hostroot import HostRoot


def test_library_on_infiniband(fixture_root: Any) -> None:
    s = sharp.scan(HostRoot(fixture_root("dgx-a100")), Fabric.INFINIBAND, None)
    assert s.capable is True
    assert s.evidence == ["/opt/mellanox/sharp/lib/libsharp_coll.so.5"]
    assert "switch support not visible" in s.basis


def test_no_evidence_and_non_ib(fixture_root: Any) -> None:
    host = HostRoot(fixture_root("dgx-h100"))
    assert sharp.scan(host, Fabric.INFINIBAND, None).capable is False
    assert sharp.scan(host, Fabric.ROCE, None).capable is False
    assert sharp.scan(host, None, None).capable is None


def test_daemon_and_override(tmp_path: Path) -> None:
    (tmp_path / "proc/4242").mkdir(parents=True)
    (tmp_path / "proc/4242/comm").write_text("sharpd\n")
    host = HostRoot(tmp_path)
    s = sharp.scan(host, Fabric.INFINIBAND, None)
    assert s.capable is True
    assert s.evidence == ["process sharpd (pid 4242)"]
    off = sharp.scan(host, Fabric.INFINIBAND, False)
    assert (off.capable, off.override, off.basis) == (False, False, "admin override label")


def test_unmounted_library_directories_prove_nothing(tmp_path: Path) -> None:
    s = sharp.scan(HostRoot(tmp_path), Fabric.INFINIBAND, None)
    assert s.capable is None
    assert s.basis == "host library directories not visible"

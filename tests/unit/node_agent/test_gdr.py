"""GPUDirect RDMA from /proc/modules."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.node_agent import gdr
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot


def scan(tmp_path: Path, text: str) -> tuple[object, list[str]]:
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc/modules").write_text(text)
    conds = Conditions()
    return gdr.scan(HostRoot(tmp_path), conds), [c.reason for c in conds.items()]


def test_peermem_loaded(tmp_path: Path) -> None:
    g, reasons = scan(
        tmp_path,
        "nvidia_peermem 16384 0 - Live 0xffffffffc0a1b000 (POE)\n"
        "nvidia 1 1 nvidia_peermem, Live 0x0\n",
    )
    assert (g.enabled, g.modules, reasons) == (True, ["nvidia_peermem"], [])  # type: ignore[attr-defined]


def test_absent(tmp_path: Path) -> None:
    g, reasons = scan(tmp_path, "nvidia 57344 0 - Live 0x0\n")
    assert (g.enabled, reasons) == (False, [])  # type: ignore[attr-defined]


def test_garbled_line_cannot_prove_absence(tmp_path: Path) -> None:
    g, reasons = scan(tmp_path, "1nvidia_peermem 16384 0 - Live 0x0\nnvidia 5 0 - Live 0x0\n")
    assert (g.enabled, reasons) == (None, ["Garbled"])  # type: ignore[attr-defined]


def test_truncated(tmp_path: Path) -> None:
    g, reasons = scan(tmp_path, "nvidia 5 0 - Live 0x0\nnvidia_pe")
    assert (g.enabled, reasons) == (None, ["Garbled"])  # type: ignore[attr-defined]


@given(st.text(max_size=200))
def test_parse_modules_never_raises(text: str) -> None:
    names, bad = gdr.parse_modules(text)
    assert bad >= 0
    assert all(n for n in names)

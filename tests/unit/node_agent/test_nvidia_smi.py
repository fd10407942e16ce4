"""`nvidia-smi topo -m` / `--query-gpu` parsing and the NVLink interpretation rules."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.api.node_topology import NvLinkRemote
from dynamiccl.node_agent import nvidia_smi
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot

REC = ".dynamiccl-recorded"


def topo_text(root: Path) -> str:
    return (root / REC / nvidia_smi.TOPO_RECORD).read_text()


def test_parses_a_dgx_h100_matrix(fixture_root: Any) -> None:
    m = nvidia_smi.parse_topo(topo_text(fixture_root("dgx-h100")))
    assert m.gpus() == [f"GPU{i}" for i in range(8)]
    assert m.nvlinks("GPU0", "GPU7") == 18
    assert m.nvlinks("GPU0", "NIC0") == 0
    assert m.cells[("GPU0", "NIC0")] == "PXB"
    assert m.cpu_affinity["GPU4"] == "56-111,168-223"
    assert m.nic_names["NIC9"] == "mlx5_5"


def test_ansi_underlined_header_is_accepted(fixture_root: Any) -> None:
    text = topo_text(fixture_root("pcie-l40s"))
    first, rest = text.split("\n", 1)
    m = nvidia_smi.parse_topo(f"\x1b[4m{first}\x1b[0m\n{rest}")
    assert len(m.gpus()) == 8


def test_legacy_column_names(fixture_root: Any) -> None:
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\nGPU0\t X \tNV4\tSOC\t0-7\nGPU1\tNV4\t X \tPHB\t0-7\n"
    )
    text += "mlx5_0\tSOC\tPHB\t X \t\n\nLegend:\n"
    m = nvidia_smi.parse_topo(text)
    assert m.devices == ["GPU0", "GPU1", "mlx5_0"]
    assert m.nvlinks("GPU1", "GPU0") == 4


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda t: t.replace("NV18", "NV17", 1), "not symmetric"),
        (lambda t: "\n".join(t.splitlines()[:5]), "missing rows"),
        (lambda t: t.replace(" X ", "NV18", 1), "diagonal"),
        (lambda t: t.replace("PXB", "PXQ", 1), "PXQ"),
        (lambda t: "garbage", "no GPU0"),
    ],
)
def test_garbled_matrix_is_rejected(fixture_root: Any, mutate: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        nvidia_smi.parse_topo(mutate(topo_text(fixture_root("dgx-h100"))))


@given(st.text(max_size=400))
def test_topo_parser_only_raises_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        nvidia_smi.parse_topo(text)


@given(st.data())
def test_topo_parser_survives_corrupted_real_output(data: st.DataObject) -> None:
    root = Path(__file__).resolve().parents[2] / "fixtures/hosts/dgx-a100"
    text = topo_text(root)
    i = data.draw(st.integers(0, len(text)))
    junk = data.draw(st.text(max_size=8))
    try:
        m = nvidia_smi.parse_topo(text[:i] + junk + text[i + len(junk) :])
    except ValueError:
        return
    # Whatever parsed is self-consistent.
    for a in m.gpus():
        for b in m.gpus():
            assert m.nvlinks(a, b) == m.nvlinks(b, a)


@given(st.text(max_size=200))
def test_query_parser_only_raises_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        nvidia_smi.parse_query(text)


def test_query_parser() -> None:
    gpus = nvidia_smi.parse_query("0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 9.0\n")
    assert gpus == [nvidia_smi.QueriedGpu(0, "NVIDIA H100 80GB HBM3", "0000:18:00.0", 90)]
    with pytest.raises(ValueError, match="expected 4 fields"):
        nvidia_smi.parse_query("0, NVIDIA H100, 00000000:18:00.0\n")
    with pytest.raises(ValueError, match="duplicate"):
        nvidia_smi.parse_query("0, a, 0000:18:00.0, 9.0\n0, b, 0000:19:00.0, 9.0\n")


def test_collect_on_a_recording_without_nvswitch_on_pci(fixture_root: Any) -> None:
    # aws-p5: the VM hides the NVSwitches; 7 x NV18 > 18 links per Hopper GPU.
    conds = Conditions()
    rep = nvidia_smi.collect(HostRoot(fixture_root("aws-p5")), conds, nvswitch_visible=False)
    assert rep is not None
    assert len(conds) == 0
    assert {(link.remote, link.links) for g in rep.gpus for link in g.nvlinks} == {
        (NvLinkRemote.NVSWITCH, 18)
    }


def test_collect_reports_an_absent_tool(tmp_path: Path) -> None:
    (tmp_path / REC).mkdir()
    conds = Conditions()
    assert nvidia_smi.collect(HostRoot(tmp_path), conds, nvswitch_visible=False) is None
    assert [c.field for c in conds.items()] == ["nvidia-smi"]


def test_live_run_without_the_binary(tmp_path: Path) -> None:
    # A non-recording root runs the real tool; this machine has none.
    conds = Conditions()
    assert nvidia_smi.collect(HostRoot(tmp_path), conds, nvswitch_visible=False) is None
    assert "not found" in conds.items()[0].message

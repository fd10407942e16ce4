"""`dynamiccl discover --root <fixture> --json` on every recorded machine layout.

Expected values are written from the machines' published layouts (tests/fixtures/
hosts/layouts.py describes them), not from discovery output: the full spec and,
for every GPU and NIC, the facts the policy and NCCL care about.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dynamiccl.cli import app

SPECS: dict[str, dict[str, Any]] = {
    "dgx-h100": {
        "name": "dgx-h100-01", "gpu": "H100", "gpus_per_node": 8, "nodes": 1,
        "intra": "nvswitch", "nvlink_GBps": 450.0, "nvls": True, "pcie_gen": 5,
        "nics_per_node": 8, "nic_Gbps": 400.0, "fabric": "infiniband", "sharp": False,
        "gdr": True,
    },
    "dgx-a100": {
        "name": "dgx-a100-07", "gpu": "A100", "gpus_per_node": 8, "nodes": 1,
        "intra": "nvswitch", "nvlink_GBps": 300.0, "nvls": False, "pcie_gen": 4,
        "nics_per_node": 8, "nic_Gbps": 200.0, "fabric": "infiniband", "sharp": True,
        "gdr": True,
    },
    "aws-p5": {
        "name": "ip-10-1-42-17", "gpu": "H100", "gpus_per_node": 8, "nodes": 1,
        "intra": "nvswitch", "nvlink_GBps": 450.0, "nvls": True, "pcie_gen": 5,
        "nics_per_node": 32, "nic_Gbps": 100.0, "fabric": "efa", "sharp": False,
        "gdr": False,
    },
    "roce-h200": {
        "name": "gpu-roce-12", "gpu": "H200", "gpus_per_node": 8, "nodes": 1,
        "intra": "nvswitch", "nvlink_GBps": 450.0, "nvls": True, "pcie_gen": 5,
        "nics_per_node": 8, "nic_Gbps": 400.0, "fabric": "roce", "sharp": False,
        "gdr": True,
    },
    "pcie-l40s": {
        "name": "l40s-node-3", "gpu": "L40S", "gpus_per_node": 8, "nodes": 1,
        "intra": "pcie", "nvlink_GBps": 0.0, "nvls": False, "pcie_gen": 4,
        "nics_per_node": 2, "nic_Gbps": 100.0, "fabric": "ethernet", "sharp": False,
        "gdr": False,
    },
    "gb200-nvl72-tray": {
        "name": "gb200-r01-tray07", "gpu": "GB200", "gpus_per_node": 4, "nodes": 1,
        "intra": "nvswitch", "nvlink_GBps": 900.0, "nvls": True, "pcie_gen": 5,
        "nics_per_node": 4, "nic_Gbps": 400.0, "fabric": "infiniband", "sharp": False,
        "gdr": True,
    },
    "container-2of8": {
        "name": "train-worker-0", "gpu": "H100", "gpus_per_node": 2, "nodes": 1,
        "intra": "nvswitch", "nvlink_GBps": 450.0, "nvls": True, "pcie_gen": 5,
        "nics_per_node": 8, "nic_Gbps": 400.0, "fabric": "infiniband", "sharp": False,
        "gdr": True, "node_gpus": 8,
    },
}  # fmt: skip

# GPU rows: (busId, model, numaNode, pcie gen, nvlinkLinks, nvlinkGbps, visible, index)
H100_BUSES = ["18", "40", "4f", "5e", "9a", "c0", "ce", "dc"]


def _hgx(model: str, visible: set[str] | None = None) -> list[tuple[Any, ...]]:
    rows = []
    shown = 0
    for i, b in enumerate(H100_BUSES):
        seen = visible is None or b in visible
        index = (i if visible is None else shown) if seen else None
        shown += seen
        links, gbps = (18, 450.0) if seen else (None, None)
        rows.append((f"0000:{b}:00.0", model, 0 if i < 4 else 1, 5, links, gbps, seen, index))
    return rows


GPUS: dict[str, list[tuple[Any, ...]]] = {
    "dgx-h100": _hgx("H100"),
    "roce-h200": _hgx("H200"),
    "container-2of8": _hgx("H100", visible={"40", "4f"}),
    "dgx-a100": [
        (f"0000:{b}:00.0", "A100", numa, 4, 12, 300.0, True, i)
        for i, (b, numa) in enumerate(
            [("06", 3), ("07", 3), ("46", 1), ("47", 1), ("86", 7), ("87", 7), ("b6", 5), ("b7", 5)]
        )
    ],
    "aws-p5": [
        (f"0000:{b}:00.0", "H100", 0 if i < 4 else 1, 5, 18, 450.0, True, i)
        for i, b in enumerate(["4f", "60", "70", "80", "90", "a0", "b0", "c0"])
    ],
    "pcie-l40s": [
        (f"0000:{b}:00.0", "L40S", 0 if i < 4 else 1, 4, 0, 0.0, True, i)
        for i, b in enumerate(["13", "14", "33", "34", "93", "94", "b3", "b4"])
    ],
    "gb200-nvl72-tray": [
        (f"{d}:01:00.0", "GB200", numa, 5, 18, 900.0, True, i)
        for i, (d, numa) in enumerate([("0008", 0), ("0009", 0), ("0018", 1), ("0019", 1)])
    ],
}

# NIC rows: (name, kind, busId, rateGbps, fabricMember, netdev, state)
_IB_H100 = [
    ("mlx5_0", "19", 25), ("mlx5_1", "41", 65), ("mlx5_2", "50", 80), ("mlx5_3", "5f", 95),
    ("mlx5_6", "9b", 155), ("mlx5_7", "c1", 193), ("mlx5_8", "cf", 207), ("mlx5_9", "dd", 221),
]  # fmt: skip
DGX_H100_NICS = sorted(
    [
        (n, "infiniband", f"0000:{b}:00.0", 400.0, True, f"ibp{d}s0", "ACTIVE")
        for n, b, d in _IB_H100
    ]
    + [
        ("mlx5_4", "roce", "0000:29:00.0", 200.0, False, "enp41s0f0np0", "ACTIVE"),
        ("mlx5_5", "roce", "0000:29:00.1", 200.0, False, "enp41s0f1np1", "ACTIVE"),
        ("eno3", "ethernet", "0000:03:00.0", 1.0, False, "eno3", "up"),
    ]
)
NICS: dict[str, list[tuple[Any, ...]]] = {
    "dgx-h100": DGX_H100_NICS,
    "container-2of8": DGX_H100_NICS,
    "roce-h200": sorted(
        [
            (f"mlx5_{i}", "roce", f"0000:{b}:00.0", 400.0, True, f"ens{d}np0", "ACTIVE")
            for i, (_, b, d) in enumerate(_IB_H100)
        ]
        + [("eno1", "ethernet", "0000:02:00.0", 10.0, False, "eno1", "up")]
    ),
    "dgx-a100": sorted(
        [
            (n, "infiniband", f"0000:{b:02x}:00.0", 200.0, True, f"ibp{b}s0", "ACTIVE")
            for n, b in [
                ("mlx5_0", 0x08),
                ("mlx5_1", 0x09),
                ("mlx5_2", 0x48),
                ("mlx5_3", 0x49),
                ("mlx5_6", 0x88),
                ("mlx5_7", 0x89),
                ("mlx5_8", 0xB8),
                ("mlx5_9", 0xB9),
            ]
        ]
        + [
            ("mlx5_4", "roce", "0000:e1:00.0", 200.0, False, "enp225s0f0", "ACTIVE"),
            ("mlx5_5", "roce", "0000:e1:00.1", 40.0, False, "enp225s0f1", "DOWN"),
        ]
    ),
    "aws-p5": sorted(
        [
            (f"rdmap{b}s0", "efa", f"0000:{b:02x}:00.0", 100.0, True, None, "ACTIVE")
            for g in [0x4F, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0]
            for b in range(g + 1, g + 5)
        ]
        + [("ens5", "ethernet", "0000:00:05.0", None, False, "ens5", "up")]
    ),
    "pcie-l40s": [
        ("eno1", "ethernet", "0000:c1:00.0", 1.0, False, "eno1", "up"),
        ("eno2", "ethernet", "0000:c1:00.1", None, False, "eno2", "down"),
        ("ens1f0np0", "ethernet", "0000:41:00.0", 100.0, True, "ens1f0np0", "up"),
        ("ens1f1np1", "ethernet", "0000:41:00.1", 100.0, True, "ens1f1np1", "up"),
    ],
    "gb200-nvl72-tray": sorted(
        [
            (f"mlx5_{i}", "infiniband", f"{d}:01:00.0", 400.0, True, None, "ACTIVE")
            for i, d in enumerate(["0000", "0002", "0010", "0012"])
        ]
        + [
            ("mlx5_4", "roce", "0006:01:00.0", 200.0, False, "enP6p1s0f0np0", "ACTIVE"),
            ("mlx5_5", "roce", "0006:01:00.1", 200.0, False, "enP6p1s0f1np1", "ACTIVE"),
        ]
    ),
}


def run_discover(root: Path, *extra: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["discover", "--root", str(root), "--json", *extra])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


def gpu_rows(topo: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (
            g["busId"], g["model"], g["numaNode"], g["pcie"]["gen"], g["nvlinkLinks"],
            g["nvlinkGbps"], g["visible"], g["index"],
        )
        for g in topo["gpus"]
    ]  # fmt: skip


def nic_rows(topo: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted(
        (
            n["name"],
            n["kind"],
            n["busId"],
            n["rateGbps"],
            n["fabricMember"],
            n["netdev"],
            n["state"],
        )
        for n in topo["nics"]
    )


@pytest.mark.parametrize("layout", sorted(SPECS))
def test_full_spec_gpus_and_nics(layout: str, fixture_root: Any) -> None:
    topo = run_discover(fixture_root(layout))
    assert topo["spec"] == SPECS[layout]
    assert topo["specUnknown"] == []
    assert gpu_rows(topo) == GPUS[layout]
    assert nic_rows(topo) == NICS[layout]
    assert topo["sources"] == ["sysfs", "procfs", "nvml"]
    assert topo["recorded"] is True
    assert topo["conditions"] == []


@pytest.mark.parametrize("layout", sorted(SPECS))
def test_nvidia_smi_fallback_gives_the_same_spec(layout: str, host_copy: Any) -> None:
    root = host_copy(layout)
    (root / ".dynamiccl-recorded" / "nvml.json").unlink()
    topo = run_discover(root)
    assert topo["sources"] == ["sysfs", "procfs", "nvidia-smi"]
    assert topo["spec"] == SPECS[layout]
    assert [c["field"] for c in topo["conditions"]] == ["nvml"]
    assert [(g["busId"], g["nvlinkLinks"]) for g in topo["gpus"]] == [
        (row[0], row[4]) for row in GPUS[layout]
    ]


@pytest.mark.parametrize("layout", sorted(SPECS))
def test_sysfs_only_names_every_unknown(layout: str, host_copy: Any) -> None:
    root = host_copy(layout)
    for f in (root / ".dynamiccl-recorded").iterdir():
        f.unlink()
    topo = run_discover(root)
    assert topo["sources"] == ["sysfs", "procfs"]
    fields = {c["field"] for c in topo["conditions"]}
    assert {"nvml", "nvidia-smi"} <= fields
    expected = SPECS[layout]
    if expected["intra"] == "pcie":
        # No NVLink on the product at all: sysfs alone is enough.
        assert topo["spec"] == expected
    else:
        assert topo["spec"] is None
        assert topo["specUnknown"] == ["intra", "nvlink_GBps", "nvls"]
        assert "intra" in fields
        assert topo["intra"] is None
        assert topo["nvls"] is None
        # What sysfs does establish is still reported.
        assert topo["fabric"] == expected["fabric"]
        assert topo["nicsPerNode"] == expected["nics_per_node"]
        assert topo["pcieGen"] == expected["pcie_gen"]
    assert [(g["busId"], g["model"], g["visible"]) for g in topo["gpus"]] == [
        (r[0], r[1], r[6]) for r in GPUS[layout]
    ]


def test_container_boundary(fixture_root: Any) -> None:
    topo = run_discover(fixture_root("container-2of8"))
    assert topo["container"] == {
        "inContainer": True,
        "runtime": "containerd",
        "orchestrator": "kubernetes",
        "cgroupVersion": 2,
        "ipcHost": False,
        "pidHost": False,
        "devShm": {"sharing": "container", "sizeBytes": 64 * 1024 * 1024},
        "gpusVisible": 2,
        "gpusOnNode": 8,
        "boundary": True,
    }
    assert topo["nvlinkMatrix"] == {
        "gpus": ["0000:40:00.0", "0000:4f:00.0"],
        "links": [[0, 18], [18, 0]],
    }


def test_host_process_is_not_a_container(fixture_root: Any) -> None:
    topo = run_discover(fixture_root("dgx-h100"))
    c = topo["container"]
    assert (c["inContainer"], c["ipcHost"], c["pidHost"], c["boundary"]) == (
        False, True, True, False,
    )  # fmt: skip
    assert c["devShm"]["sharing"] == "host"
    assert topo["nvswitches"] == [
        {"busId": f"0000:0{k}:00.0", "deviceId": "0x22a3"} for k in (5, 6, 7, 8)
    ]
    assert topo["nvlinkMatrix"]["links"][0] == [0] + [18] * 7


def test_nvl72_fabric_and_arm_cpu(fixture_root: Any) -> None:
    topo = run_discover(fixture_root("gb200-nvl72-tray"))
    fabrics = {json.dumps(g["fabric"], sort_keys=True) for g in topo["gpus"]}
    assert fabrics == {
        json.dumps(
            {
                "clusterUuid": "3c5d8f21-7a4e-4b9c-9e2f-6a1b2c3d4e5f",
                "cliqueId": 32766,
                "state": "completed",
            },
            sort_keys=True,
        )
    }
    assert topo["cpu"]["arch"] == "arm64"
    assert topo["cpu"]["modelName"] == "Neoverse-V2"
    # GPU links are Gen6-capable but the Grace root port is Gen5: NCCL's min().
    assert {g["pcie"]["speedGts"] for g in topo["gpus"]} == {32.0}


def test_sharp_override_flag(fixture_root: Any) -> None:
    on = run_discover(fixture_root("dgx-h100"), "--sharp", "true")
    assert on["spec"]["sharp"] is True
    assert on["sharp"]["basis"] == "admin override label"
    assert "override" in on["sources"]
    off = run_discover(fixture_root("dgx-a100"), "--sharp", "false")
    assert off["spec"]["sharp"] is False
    auto = run_discover(fixture_root("dgx-a100"))
    assert auto["sharp"]["evidence"] == ["/opt/mellanox/sharp/lib/libsharp_coll.so.5"]


def test_the_real_host_never_crashes() -> None:
    # This machine: no GPU, no NVML library. Whatever it has, discovery reports it.
    topo = run_discover(Path("/"))
    fields = {c["field"] for c in topo["conditions"]}
    assert "nvml" in fields
    if not topo["gpus"]:
        assert topo["spec"] is None
        assert "gpu" in topo["specUnknown"]


def test_bad_root_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["discover", "--root", str(tmp_path / "nope"), "--json"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"--root: {tmp_path / 'nope'}: not a directory"]

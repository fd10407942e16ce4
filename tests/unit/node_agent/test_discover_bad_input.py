"""Broken hosts: missing, truncated, garbled files and NVML errors.

Every case must give a partial topology whose conditions name what is
unknown: never a crash, never a guessed value presented as fact.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot

GPU0 = "0000:18:00.0"


def topo_of(root: Path) -> dict[str, Any]:
    return discover(HostRoot(root)).topology.wire()


def sysfs_dev(root: Path, bus: str) -> Path:
    return (root / "sys/bus/pci/devices" / bus).resolve()


def fields(topo: dict[str, Any]) -> set[str]:
    return {c["field"] for c in topo["conditions"]}


def nvml(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / ".dynamiccl-recorded/nvml.json").read_text())
    return data


def write_nvml(root: Path, data: dict[str, Any]) -> None:
    (root / ".dynamiccl-recorded/nvml.json").write_text(json.dumps(data))


def test_truncated_link_speed_makes_pcie_gen_unknown(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    (sysfs_dev(root, GPU0) / "max_link_speed").write_text("32.0 GT")
    topo = topo_of(root)
    gpu = topo["gpus"][0]
    assert gpu["pcie"]["gen"] is None
    assert gpu["pcie"]["speedGts"] is None
    assert f"gpus[{GPU0}].pcie" in fields(topo)
    assert topo["pcieGen"] is None
    assert topo["spec"] is None
    assert topo["specUnknown"] == ["pcie_gen"]
    assert all(g["pcie"]["gen"] == 5 for g in topo["gpus"][1:])


def test_garbled_upstream_port_speed_is_not_replaced_by_the_device_speed(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    (sysfs_dev(root, GPU0).parent / "max_link_speed").write_text("fast\n")
    topo = topo_of(root)
    assert topo["gpus"][0]["pcie"]["gen"] is None
    assert any(
        "upstream" not in c["message"] and c["reason"] == "Garbled" for c in topo["conditions"]
    )


def test_garbled_ib_rate_makes_nic_speed_unknown(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    (root / "sys/class/infiniband/mlx5_2/ports/1/rate").write_text("400 Gb/sec (4X\n")
    topo = topo_of(root)
    nic = next(n for n in topo["nics"] if n["name"] == "mlx5_2")
    assert nic["rateGbps"] is None
    assert "nics[mlx5_2:1].rate" in fields(topo)
    assert topo["nicGbps"] is None
    assert topo["nicsPerNode"] == 8
    assert topo["specUnknown"] == ["nic_Gbps"]


def test_missing_port_state_makes_nic_count_unknown(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    (root / "sys/class/infiniband/mlx5_7/ports/1/state").unlink()
    topo = topo_of(root)
    assert "nics[mlx5_7:1].state" in fields(topo)
    assert topo["nicsPerNode"] is None
    assert topo["fabric"] == "infiniband"
    assert "nics_per_node" in topo["specUnknown"]
    assert all(n["fabricMember"] is None for n in topo["nics"])


def test_all_ib_states_unreadable_make_the_fabric_unknown(host_copy: Any) -> None:
    root = host_copy("dgx-a100")
    for port in (root / "sys/class/infiniband").glob("*/ports/1/state"):
        port.write_text("4: ACTIVE (garbled)\n")
    topo = topo_of(root)
    assert topo["fabric"] is None
    assert "fabric" in fields(topo)
    assert "fabric" in topo["specUnknown"]


def test_garbled_nvml_recording_falls_back_to_nvidia_smi(host_copy: Any) -> None:
    root = host_copy("dgx-a100")
    (root / ".dynamiccl-recorded/nvml.json").write_text('{"devices": [')
    topo = topo_of(root)
    assert topo["sources"][-1] == "nvidia-smi"
    assert [c["reason"] for c in topo["conditions"]] == ["Garbled"]
    assert topo["spec"]["nvlink_GBps"] == 300.0


def test_nvml_init_error_falls_back(host_copy: Any) -> None:
    root = host_copy("pcie-l40s")
    data = nvml(root)
    data["init"] = "NVML_ERROR_DRIVER_NOT_LOADED"
    write_nvml(root, data)
    topo = topo_of(root)
    assert topo["conditions"][0]["message"] == "nvmlInit: NVML_ERROR_DRIVER_NOT_LOADED"
    assert topo["sources"][-1] == "nvidia-smi"


def test_nvlink_error_on_one_gpu_leaves_intra_unknown(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    data = nvml(root)
    data["devices"][3]["nvlink"][7] = {"error": "NVML_ERROR_UNKNOWN"}
    write_nvml(root, data)
    topo = topo_of(root)
    bad = topo["gpus"][3]
    assert bad["nvlinkLinks"] is None
    assert bad["nvlinkPeers"] == []
    assert "gpus[0000:5e:00.0].nvlink" in fields(topo)
    assert topo["intra"] is None
    assert topo["nvls"] is None
    assert set(topo["specUnknown"]) == {"intra", "nvlink_GBps", "nvls"}
    assert all(g["nvlinkLinks"] == 18 for i, g in enumerate(topo["gpus"]) if i != 3)


def test_nvml_name_error_keeps_the_pci_id_name(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    data = nvml(root)
    data["devices"][0]["name"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    write_nvml(root, data)
    topo = topo_of(root)
    assert topo["gpus"][0]["model"] == "H100"  # from the PCI device id 0x2330
    assert f"gpus[{GPU0}].product" in fields(topo)
    assert topo["spec"]["gpu"] == "H100"


def test_unknown_device_id_without_nvml_leaves_the_model_unknown(host_copy: Any) -> None:
    root = host_copy("pcie-l40s")
    for f in (root / ".dynamiccl-recorded").iterdir():
        f.unlink()
    (sysfs_dev(root, "0000:13:00.0") / "device").write_text("0x9999\n")
    topo = topo_of(root)
    assert topo["gpus"][0]["model"] is None
    assert topo["gpus"][0]["nvlinkLinks"] is None  # an unknown part may have NVLink
    assert "gpus[0000:13:00.0].model" in fields(topo)
    assert {"gpu", "intra"} <= set(topo["specUnknown"])


def test_short_gpu_list_does_not_shrink_the_gpu_count(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    data = nvml(root)
    data["devices"] = data["devices"][:7]
    write_nvml(root, data)
    topo = topo_of(root)
    assert "container.gpusVisible" in fields(topo)
    assert topo["container"]["gpusVisible"] is None
    assert "gpus_per_node" in topo["specUnknown"]


def test_truncated_modules_list_cannot_prove_absence(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    (root / "proc/modules").write_text("nvidia_uvm 16384 0 - Live 0x0\nnvidia 163")
    topo = topo_of(root)
    assert topo["gdr"]["enabled"] is None
    assert "gdr" in fields(topo)
    assert "gdr" not in topo["spec"]


def test_garbled_topo_matrix_names_the_matrix(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    (root / ".dynamiccl-recorded/nvml.json").unlink()
    topo_file = root / ".dynamiccl-recorded/nvidia-smi-topo-m.txt"
    topo_file.write_text(topo_file.read_text().replace("NV18", "NV?", 1))
    topo = topo_of(root)
    assert "nvlinkMatrix" in fields(topo)
    assert topo["intra"] is None


def test_no_sysfs_at_all(tmp_path: Path) -> None:
    (tmp_path / ".dynamiccl-recorded").mkdir()
    topo = topo_of(tmp_path)
    assert topo["spec"] is None
    assert topo["gpus"] == []
    assert topo["fabric"] is None
    assert {"gpus", "fabric", "nodeName", "cpu", "gdr"} <= fields(topo)


def test_unreadable_file_is_reported_not_raised(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    target = sysfs_dev(root, GPU0) / "max_link_width"
    target.unlink()
    target.mkdir()  # reading a directory fails with EISDIR
    topo = topo_of(root)
    assert any(c["reason"] == "Unreadable" for c in topo["conditions"])
    assert topo["gpus"][0]["pcie"]["width"] is None


# --------------------------------------------------------------------------- property
TRUTH: dict[str, dict[str, Any]] = {}


def _truth(layout: str, root: Path) -> dict[str, Any]:
    if layout not in TRUTH:
        TRUTH[layout] = topo_of(root)["spec"]
    return TRUTH[layout]


def _files(root: Path) -> list[Path]:
    skip = {"hostname"}
    return sorted(
        p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.name not in skip
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    layout=st.sampled_from(["dgx-h100", "pcie-l40s"]),
    pick=st.integers(min_value=0),
    how=st.sampled_from(["truncate", "append", "prepend", "empty"]),
    cut=st.integers(min_value=0, max_value=200),
    # Corruption, not a different machine: digits, punctuation, control and
    # non-ASCII characters (letters could spell another valid module name).
    junk=st.text(
        alphabet=st.sampled_from("0123456789#%&*()[]{}<>|/\\~^?!;:=+,.'\"\x00\x07\t\u00e4\u4e2d"),
        min_size=1,
        max_size=6,
    ),
)
def test_a_broken_file_never_yields_a_wrong_spec(  # noqa: PLR0917 - hypothesis arguments
    tmp_path_factory: Any, fixture_root: Any, layout: str, pick: int, how: str, cut: int, junk: str
) -> None:
    src = fixture_root(layout)
    truth = _truth(layout, src)
    root = tmp_path_factory.mktemp("broken") / layout
    shutil.copytree(src, root, symlinks=True)
    files = _files(root)
    victim = files[pick % len(files)]
    text = victim.read_text()
    if how == "truncate":
        new = text[: cut % max(len(text.rstrip("\n")), 1)]
    elif how == "append":
        new = text.rstrip("\n") + junk + "\n"
    elif how == "prepend":
        new = junk + text
    else:
        new = ""
    victim.write_text(new)
    spec = topo_of(root)["spec"]
    if spec is not None:
        # Every key present is the truth; optional extras may become unknown (absent).
        wrong = {k: (v, truth.get(k)) for k, v in spec.items() if k != "name" and truth.get(k) != v}
        assert not wrong, f"{victim.relative_to(root)}: {text!r} -> {new!r}: {wrong}"
        assert set(truth) - set(spec) <= {"gdr", "node_gpus"}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["half"])
def test_every_file_broken_in_turn_never_yields_a_wrong_spec(
    host_copy: Any, fixture_root: Any, how: str
) -> None:
    """Exhaustive companion of the property test: each file of the DGX H100 tree, in turn."""
    truth = _truth("dgx-h100", fixture_root("dgx-h100"))
    root = host_copy("dgx-h100")
    for victim in _files(root):
        text = victim.read_text()
        victim.write_text(text[: len(text.rstrip()) // 2] if how == "half" else "1" + text)
        spec = topo_of(root)["spec"]
        victim.write_text(text)
        if spec is None:
            continue
        wrong = {k: v for k, v in spec.items() if k != "name" and truth.get(k) != v}
        assert not wrong, f"{victim.relative_to(root)}: {wrong}"
        assert set(truth) - set(spec) <= {"gdr", "node_gpus"}


def test_an_unidentifiable_pci_function_may_be_a_gpu(host_copy: Any) -> None:
    root = host_copy("container-2of8")
    (sysfs_dev(root, GPU0) / "class").write_text("garbage\n")
    topo = topo_of(root)
    assert topo["container"]["gpusOnNode"] is None
    assert topo["container"]["boundary"] is None
    assert "container.gpusOnNode" in fields(topo)
    assert topo["spec"]["gpus_per_node"] == 2  # what this container sees is still known
    assert "node_gpus" not in topo["spec"]


def test_procfs_keeps_a_gpu_whose_sysfs_entry_is_broken(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    for f in (root / ".dynamiccl-recorded").iterdir():
        f.unlink()
    (sysfs_dev(root, GPU0) / "vendor").write_text("0x10\n")
    topo = topo_of(root)
    assert len(topo["gpus"]) == 8
    assert topo["gpus"][0]["model"] is None
    assert "gpus_per_node" not in topo["specUnknown"]
    assert "gpu" in topo["specUnknown"]

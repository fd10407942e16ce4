"""The NVML wrapper: recorded answers (errors included) and the live library's absence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.node_topology import NvLinkRemote
from dynamiccl.node_agent import nvml
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot

H100: dict[str, Any] = {
    "pci_bus_id": "00000000:18:00.0",
    "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-1",
    "cuda_compute_capability": [9, 0],
    "mig_mode": [0, 0],
    "nvlink": [{"state": 1, "remote_device_type": 2, "remote_pci_bus_id": "00000000:05:00.0"}] * 18,
}


def collect(data: dict[str, Any]) -> tuple[Any, list[tuple[str, str]]]:
    conds = Conditions()
    rep = nvml.collect(nvml.RecordedBackend(data), conds)
    return rep, [(c.field, c.message) for c in conds.items()]


def test_recorded_h100() -> None:
    rep, conds = collect({"driver_version": "535", "devices": [H100]})
    assert conds == []
    (g,) = rep.gpus
    assert (g.bus_id, g.index, g.sm, g.mig_enabled, g.active_links) == (
        "0000:18:00.0",
        0,
        90,
        False,
        18,
    )
    assert [(link.remote, link.remote_bus_id, link.links) for link in g.nvlinks] == [
        (NvLinkRemote.NVSWITCH, "0000:05:00.0", 18)
    ]


def test_fewer_links_than_the_generation_allows_stops_at_invalid_argument() -> None:
    dev = {**H100, "nvlink": H100["nvlink"][:4] + [{"state": 0}] * 2}
    rep, conds = collect({"devices": [dev]})
    assert rep.gpus[0].active_links == 4
    assert conds[0][0] == "driverVersion"


def test_untyped_remote_gpu_is_typed_by_its_bus_id() -> None:
    a = {**H100, "nvlink": [{"state": 1, "remote_pci_bus_id": "00000000:19:00.0"}] * 4}
    b = {
        **H100,
        "pci_bus_id": "00000000:19:00.0",
        "nvlink": [{"state": 1, "remote_pci_bus_id": "00000000:18:00.0"}] * 4,
    }
    rep, _ = collect({"devices": [a, b]})
    assert {link.remote for g in rep.gpus for link in g.nvlinks} == {NvLinkRemote.GPU}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"init": "NVML_ERROR_DRIVER_NOT_LOADED"}, "nvml"),
        ({"device_count": {"error": "NVML_ERROR_UNKNOWN"}, "devices": []}, "nvml"),
        (
            {"devices": [{**H100, "pci_bus_id": {"error": "NVML_ERROR_GPU_IS_LOST"}}]},
            "nvml.devices[0]",
        ),
        ({"devices": [{**H100, "pci_bus_id": "garbage"}]}, "nvml.devices[0]"),
        (
            {"devices": [{**H100, "cuda_compute_capability": {"error": "NVML_ERROR_UNKNOWN"}}]},
            "gpus[0000:18:00.0].computeCapability",
        ),
        (
            {"devices": [{**H100, "gpu_fabric_info": {"error": "NVML_ERROR_UNKNOWN"}}]},
            "gpus[0000:18:00.0].fabric",
        ),
        (
            {"devices": [{**H100, "nvlink_error": "NVML_ERROR_NO_PERMISSION"}]},
            "gpus[0000:18:00.0].nvlink",
        ),
    ],
)
def test_nvml_errors_become_named_conditions(data: dict[str, Any], field: str) -> None:
    _, conds = collect(data)
    assert field in [f for f, _ in conds]


def test_nvml_error_leaves_links_unknown() -> None:
    rep, _ = collect({"devices": [{**H100, "nvlink_error": "NVML_ERROR_NO_PERMISSION"}]})
    assert rep.gpus[0].active_links is None


def test_not_supported_nvlink_means_none() -> None:
    rep, _ = collect({"devices": [{**H100, "nvlink_error": "NVML_ERROR_NOT_SUPPORTED"}]})
    assert rep.gpus[0].active_links == 0


def test_recording_problems(tmp_path: Path) -> None:
    (tmp_path / ".dynamiccl-recorded").mkdir()
    conds = Conditions()
    assert nvml.backend_for(HostRoot(tmp_path), conds) is None
    (tmp_path / ".dynamiccl-recorded/nvml.json").write_text("[1, 2]")
    assert nvml.backend_for(HostRoot(tmp_path), conds) is None
    assert [c.reason for c in conds.items()] == ["Unavailable", "Garbled"]


def test_live_library_absent_on_this_machine(tmp_path: Path) -> None:
    conds = Conditions()
    be = nvml.backend_for(HostRoot(tmp_path), conds)
    assert be is not None  # nvidia-ml-py is installed; the driver library is not
    assert nvml.collect(be, conds) is None
    assert conds.items()[0].message.startswith("nvmlInit: NVML_ERROR_")

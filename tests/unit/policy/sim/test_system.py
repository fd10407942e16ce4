"""Resolving a topology spec: derived numbers and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from dynamiccl.policy.sim.calibration_data import calibration_system, load_system_specs
from dynamiccl.policy.sim.hardware import HardwareError
from dynamiccl.policy.sim.system import derive_spec, resolve


def spec(**over: Any) -> Any:
    """Two 8x H200 calibration nodes with some keys changed."""
    return derive_spec(load_system_specs()["dgx-h200"], nodes=2, **over)


def test_dgx_h200_numbers() -> None:
    s = calibration_system("dgx-h200")
    assert (s.ranks, s.nodes, s.local_ranks) == (8, 1, 8)
    assert s.intra_GBps == 450
    # 18 NVLinks counted at NCCL's SM90_NVLINK_BW = 20.6 GB/s
    assert s.nccl_intra_GBps == pytest.approx(18 * 20.6)


def test_network_bandwidth_is_the_sum_of_the_nodes_nics() -> None:
    s = calibration_system("aws-p5-2node")
    assert s.net_node_GBps == pytest.approx(32 * 100 / 8)
    assert s.nodes == 2
    assert s.ranks == 16


def test_container_split_makes_each_container_a_nccl_node() -> None:
    s = resolve(spec(container_gpus=2))
    assert s.container_split
    assert (s.nodes, s.local_ranks, s.ranks, s.physical_nodes) == (8, 2, 16, 2)


@pytest.mark.parametrize("bad", [3, 0, 9, True, "two"])
def test_container_gpus_must_divide_the_node(bad: object) -> None:
    with pytest.raises(HardwareError, match=r"^container_gpus: "):
        resolve(spec(container_gpus=bad))


def test_nvlink_topology_with_a_pcie_only_gpu_is_rejected() -> None:
    with pytest.raises(HardwareError, match=r"^intra: nvswitch but gpu L40S has no NVLink"):
        resolve(spec(gpu="L40S", nvls=False))


def test_nvls_needs_a_hopper_class_gpu() -> None:
    with pytest.raises(HardwareError, match=r"^nvls: true but gpu A100"):
        resolve(spec(gpu="A100", nvlink_GBps=300))


def test_unknown_gpu_is_an_error() -> None:
    with pytest.raises(HardwareError, match=r"^gpu: 'X100' is not a known GPU"):
        resolve(spec(gpu="X100"))


def test_cpu_vendor_is_validated() -> None:
    assert resolve(spec(cpu_vendor="amd")).cpu_vendor == "amd"
    with pytest.raises(HardwareError, match=r"^cpu_vendor: "):
        resolve(spec(cpu_vendor="via"))


def test_bidirectional_nvlink_figure_is_rejected() -> None:
    with pytest.raises(HardwareError, match=r"^nvlink_GBps: 900 exceeds H200's 450 GB/s"):
        resolve(spec(nvlink_GBps=900))
    assert resolve(spec(nvlink_GBps=200)).intra_GBps == 200  # fewer links (H800-like) is fine

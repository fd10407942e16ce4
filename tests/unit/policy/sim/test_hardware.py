"""GPU catalog: known models, NCCL's link constants, clear errors."""

from __future__ import annotations

import pytest

from dynamiccl.policy.sim.hardware import (
    CATALOG,
    Arch,
    HardwareError,
    gpu_spec,
    nccl_pcie_GBps,
    pcie_GBps,
)


def test_lookup_is_case_insensitive() -> None:
    assert gpu_spec("h100").name == "H100"
    assert gpu_spec(" B200 ").name == "B200"


def test_unknown_gpu_names_the_field_and_lists_known_models() -> None:
    with pytest.raises(HardwareError) as err:
        gpu_spec("X100")
    msg = str(err.value)
    assert msg.startswith("gpu: 'X100' is not a known GPU; known: ")
    for name in ("A100", "H100", "H200", "H800", "B200", "GB200", "L40S", "RTX3080", "V100"):
        assert name in msg


@pytest.mark.parametrize(
    ("name", "nvlink", "nccl_link", "arch"),
    [
        ("V100", 150.0, 20.0, Arch.VOLTA),
        ("A100", 300.0, 20.0, Arch.AMPERE),
        ("H800", 200.0, 20.6, Arch.HOPPER),
        ("H200", 450.0, 20.6, Arch.HOPPER),
        ("B200", 900.0, 40.1, Arch.BLACKWELL),
        ("RTX3090", 56.25, 12.0, Arch.AMPERE),
        ("L40S", 0.0, 20.0, Arch.AMPERE),
    ],
)
def test_published_and_nccl_numbers(name: str, nvlink: float, nccl_link: float, arch: Arch) -> None:
    spec = gpu_spec(name)
    assert spec.nvlink_GBps == pytest.approx(nvlink)
    assert spec.nccl_nvlink_link_GBps == pytest.approx(nccl_link)
    assert spec.arch is arch


def test_nvlink_generations() -> None:
    gens = {n: gpu_spec(n).nvlink_gen for n in ("V100", "A100", "H100", "B200", "L40S")}
    assert gens == {"V100": 2, "A100": 3, "H100": 4, "B200": 5, "L40S": 0}


def test_nvls_only_from_hopper_on() -> None:
    for spec in CATALOG.values():
        assert spec.nvls_capable == (spec.compute_capability >= 90)


def test_pcie_bandwidths_double_per_generation() -> None:
    assert nccl_pcie_GBps(3) == 12.0  # NCCL's PCI_BW
    assert nccl_pcie_GBps(5) == 48.0
    assert pcie_GBps(4) == pytest.approx(2 * pcie_GBps(3))

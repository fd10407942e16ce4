"""GPU catalog: the per-model facts the NCCL model and the simulator need.

Physical numbers are the vendors' published figures (NVLink generation, links
per GPU and per-link unidirectional bandwidth, PCIe generation). The NCCL-side
numbers are NCCL's own constants, which differ from the physical ones on
purpose: NCCL's topology search counts an NVLink at `SM80_NVLINK_BW = 20.0`,
`SM90_NVLINK_BW = 20.6`, `SM100_NVLINK_BW = 40.1`, `SM86_NVLINK_BW = 12.0` GB/s
(NVIDIA/nccl `src/graph/topo.h`, `ncclTopoNVLinkBw`) and a PCIe x16 link at
12 GB/s for Gen3, doubling per generation (`PCI_BW 12.0 // PCI Gen3 x16`).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field


class HardwareError(ValueError):
    """Unknown or inconsistent hardware; the message names the field."""


class Arch(IntEnum):
    """NCCL's compute-capability index into its tuning tables (`compCapIndex`)."""

    VOLTA = 0  # also Turing and older: minCompCap < 80
    AMPERE = 1  # 80 <= cc < 90 (includes Ada, cc 89)
    HOPPER = 2  # 90 <= cc < 100
    BLACKWELL = 3  # cc >= 100


class GpuSpec(BaseModel):
    """One GPU model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    compute_capability: int = Field(ge=60, le=130, description="e.g. 90 for sm_90")
    nvlink_gen: int = Field(ge=0, le=6, description="NVLink generation (0: none)")
    nvlink_links: int = Field(ge=0, description="NVLink links per GPU (0: none)")
    nvlink_link_GBps: float = Field(ge=0, description="per link, unidirectional")  # noqa: N815
    pcie_gen: int = Field(ge=3, le=6, description="host interface generation (x16)")
    nvls_capable: bool = Field(description="NVLink SHARP (multicast) with an NVSwitch")

    @property
    def arch(self) -> Arch:
        """NCCL's table index for this compute capability."""
        cc = self.compute_capability
        if cc >= 100:
            return Arch.BLACKWELL
        if cc >= 90:
            return Arch.HOPPER
        if cc >= 80:
            return Arch.AMPERE
        return Arch.VOLTA

    @property
    def nvlink_GBps(self) -> float:  # noqa: N802 - contract spelling
        """Default per-GPU unidirectional NVLink bandwidth (0 without NVLink)."""
        return self.nvlink_links * self.nvlink_link_GBps

    @property
    def nccl_nvlink_link_GBps(self) -> float:  # noqa: N802
        """NCCL's per-link NVLink bandwidth constant (`ncclTopoNVLinkBw`, topo.h)."""
        cc = self.compute_capability
        if cc >= 100:
            return 40.1
        if cc >= 90:
            return 20.6
        if cc == 86:
            return 12.0
        if cc >= 70:
            return 20.0
        return 18.0


def _gpu(row: tuple[str, int, int, float, int, bool]) -> GpuSpec:
    name, cc, links, link, pcie, nvls = row
    gen = 0 if links == 0 else 2 if cc < 80 else 3 if cc < 90 else 4 if cc < 100 else 5
    return GpuSpec(
        name=name,
        compute_capability=cc,
        nvlink_gen=gen,
        nvlink_links=links,
        nvlink_link_GBps=link,
        pcie_gen=pcie,
        nvls_capable=nvls,
    )


# Published figures: NVLink 2/3/4 carry 25 GB/s per link and direction, NVLink 5
# 50 GB/s (V100 6 links = 300 GB/s bidirectional, A100 12 = 600, H100/H200 18 =
# 900, B200 18 = 1.8 TB/s; the export parts A800/H800 keep 8 links). NVLS
# (multicast through the NVSwitch) exists from Hopper on.
CATALOG: Final[dict[str, GpuSpec]] = {
    g.name: g
    for g in (
        _gpu(("V100", 70, 6, 25.0, 3, False)),
        _gpu(("T4", 75, 0, 0.0, 3, False)),
        _gpu(("A100", 80, 12, 25.0, 4, False)),
        _gpu(("A800", 80, 8, 25.0, 4, False)),
        _gpu(("A10", 86, 0, 0.0, 4, False)),
        _gpu(("RTX3080", 86, 0, 0.0, 4, False)),
        _gpu(("RTX3090", 86, 4, 14.0625, 4, False)),
        _gpu(("L4", 89, 0, 0.0, 4, False)),
        _gpu(("L40S", 89, 0, 0.0, 4, False)),
        _gpu(("RTX4090", 89, 0, 0.0, 4, False)),
        _gpu(("H100", 90, 18, 25.0, 5, True)),
        _gpu(("H800", 90, 8, 25.0, 5, True)),
        _gpu(("H20", 90, 18, 25.0, 5, True)),
        _gpu(("H200", 90, 18, 25.0, 5, True)),
        _gpu(("GH200", 90, 18, 25.0, 5, True)),
        _gpu(("B100", 100, 18, 50.0, 5, True)),
        _gpu(("B200", 100, 18, 50.0, 5, True)),
        _gpu(("GB200", 100, 18, 50.0, 5, True)),
    )
}


def gpu_spec(name: str) -> GpuSpec:
    """The catalog entry for `name` (case-insensitive); HardwareError names the field."""
    for key, spec in CATALOG.items():
        if key.lower() == name.strip().lower():
            return spec
    known = ", ".join(CATALOG)
    raise HardwareError(f"gpu: {name!r} is not a known GPU; known: {known}")


def nccl_pcie_GBps(gen: int) -> float:  # noqa: N802
    """NCCL's x16 PCIe bandwidth: 12 GB/s at Gen3 (`PCI_BW`), doubling per generation."""
    return 12.0 * 2.0 ** (gen - 3)


def pcie_GBps(gen: int) -> float:  # noqa: N802
    """Physical x16 PCIe bandwidth per direction (~15.75 GB/s at Gen3, x2 per gen)."""
    return 15.75 * 2.0 ** (gen - 3)

"""Published facts about NVIDIA GPU products: PCI device ids, names, architectures.

Used to name a GPU when only sysfs is available and to turn an active NVLink
count into bandwidth (per-link unidirectional GB/s of each NVLink generation).
A device id not listed here stays unknown; nothing is inferred from a
"similar" id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Product:
    """One GPU product."""

    model: str  # spec spelling: H100, A100, L40S, GB200, ...
    product: str
    architecture: str
    sm: int  # compute capability x10
    nvlink: bool  # the part has NVLink at all


PRODUCTS: Final[dict[int, Product]] = {
    0x20B0: Product("A100", "NVIDIA A100-SXM4-40GB", "ampere", 80, True),
    0x20B2: Product("A100", "NVIDIA A100-SXM4-80GB", "ampere", 80, True),
    0x20B5: Product("A100", "NVIDIA A100 80GB PCIe", "ampere", 80, True),
    0x20F1: Product("A100", "NVIDIA A100-PCIE-40GB", "ampere", 80, True),
    0x2206: Product("RTX3080", "NVIDIA GeForce RTX 3080", "ampere", 86, False),
    0x2330: Product("H100", "NVIDIA H100 80GB HBM3", "hopper", 90, True),
    0x2331: Product("H100", "NVIDIA H100 PCIe", "hopper", 90, True),
    0x2324: Product("H800", "NVIDIA H800", "hopper", 90, True),
    0x2335: Product("H200", "NVIDIA H200", "hopper", 90, True),
    0x26B5: Product("L40", "NVIDIA L40", "ada", 89, False),
    0x26B9: Product("L40S", "NVIDIA L40S", "ada", 89, False),
    0x27B8: Product("L4", "NVIDIA L4", "ada", 89, False),
    0x2901: Product("B200", "NVIDIA B200", "blackwell", 100, True),
    0x2941: Product("GB200", "NVIDIA GB200", "blackwell", 100, True),
}

# NVSwitch PCI device ids (HGX baseboards expose them as class 0x068000).
NVSWITCHES: Final[dict[int, str]] = {0x1AF1: "NVSwitch gen2 (A100)", 0x22A3: "NVSwitch gen3 (H100)"}

# Per-link, per-direction NVLink bandwidth (GB/s) by compute capability x10.
NVLINK_LINK_GBPS: Final[dict[int, float]] = {
    60: 20.0,  # NVLink1, P100
    70: 25.0,  # NVLink2, V100
    80: 25.0,  # NVLink3, A100
    86: 14.0625,  # NVLink3 x4 on GA102
    90: 25.0,  # NVLink4, H100/H200
    100: 50.0,  # NVLink5, B200/GB200
}

ARCH_BY_MAJOR: Final = {6: "pascal", 7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell"}

# Longest match first: "GB200" before "B200", "H100 NVL" handled as H100.
_NAME_MODELS: Final = (
    "GB200",
    "GB300",
    "B200",
    "B300",
    "H200",
    "H100",
    "H800",
    "H20",
    "A100",
    "A800",
    "A10G",
    "A10",
    "L40S",
    "L40",
    "L4",
    "V100",
)
_RTX = re.compile(r"RTX ?([0-9]{4})")


def model_from_name(name: str) -> str | None:
    """Spec model of an NVML product name (``NVIDIA H100 80GB HBM3`` -> ``H100``)."""
    upper = name.upper()
    for model in _NAME_MODELS:
        if re.search(rf"(^|[^A-Z0-9]){model}([^A-Z0-9]|$)", upper):
            return model
    m = _RTX.search(upper)
    return f"RTX{m.group(1)}" if m else None


def architecture(sm: int | None) -> str | None:
    """Architecture name of a compute capability x10 (89 is Ada, not Ampere)."""
    if sm is None:
        return None
    if sm == 89:
        return "ada"
    return ARCH_BY_MAJOR.get(sm // 10)


def nvlink_link_gbps(sm: int | None) -> float | None:
    """Unidirectional GB/s of one NVLink of a GPU with this compute capability."""
    return None if sm is None else NVLINK_LINK_GBPS.get(sm)


def max_nvlinks(sm: int) -> int:
    """How many NVLinks a GPU generation can have (NCCL's bound when probing NVML)."""
    if sm < 60:
        return 0
    if sm < 70:
        return 4
    if sm < 80:
        return 6
    if sm < 90:
        return 12
    return 18

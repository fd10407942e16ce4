"""GPU product facts."""

from __future__ import annotations

import pytest

from dynamiccl.node_agent import gpu_table


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce RTX 3080", "RTX3080"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Quadro something", None),
    ],
)
def test_model_from_name(name: str, model: str | None) -> None:
    assert gpu_table.model_from_name(name) == model


def test_nvlink_bandwidth_per_generation() -> None:
    assert 18 * (gpu_table.nvlink_link_gbps(90) or 0) == 450
    assert 12 * (gpu_table.nvlink_link_gbps(80) or 0) == 300
    assert 18 * (gpu_table.nvlink_link_gbps(100) or 0) == 900
    assert gpu_table.nvlink_link_gbps(89) is None
    assert gpu_table.architecture(89) == "ada"
    assert gpu_table.architecture(90) == "hopper"
    assert [gpu_table.max_nvlinks(s) for s in (50, 60, 70, 80, 90, 100)] == [0, 4, 6, 12, 18, 18]


def test_table_is_consistent() -> None:
    for dev, p in gpu_table.PRODUCTS.items():
        assert gpu_table.model_from_name(p.product) == p.model, hex(dev)
        assert gpu_table.architecture(p.sm) == p.architecture

"""Shared unit-test data."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def h100_job_features() -> dict[str, Any]:
    """State features (as JSON) of a 16-rank job on 2 nodes of 8x H100, NVSwitch + NVLS,
    8x 400 Gb/s InfiniBand per node."""
    return {
        "world_size": 16,
        "gpus_per_pod": 8,
        "replicas": 2,
        "nproc_per_node": 8,
        "topology": {
            "name": "t",
            "gpu": "H100",
            "gpus_per_node": 8,
            "nodes": 2,
            "intra": "nvswitch",
            "nvlink_GBps": 450,
            "nvls": True,
            "pcie_gen": 5,
            "nics_per_node": 8,
            "nic_Gbps": 400,
            "fabric": "infiniband",
            "sharp": False,
        },
    }

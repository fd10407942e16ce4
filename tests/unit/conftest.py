"""Shared unit-test data."""

from __future__ import annotations

from typing import Any

import pytest

from tests.topology_samples import h100_job


@pytest.fixture
def h100_job_features() -> dict[str, Any]:
    """State features (as JSON) of a 16-rank job on 2 nodes of 8x H100, NVSwitch + NVLS,
    8x 400 Gb/s InfiniBand per node."""
    return h100_job()

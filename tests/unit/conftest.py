"""Shared unit-test data: a job's state features; the example topology, PyTorchJob and their
simulated time table (the demo's and the test stand-ins' tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dynamiccl.api.topology import TopologySpec
from dynamiccl.testing.workload import TimeTable, build_time_table
from tests.topology_samples import h100_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def h100_job_features() -> dict[str, Any]:
    """State features (as JSON) of a 16-rank job on 2 nodes of 8x H100, NVSwitch + NVLS,
    8x 400 Gb/s InfiniBand per node."""
    return h100_job()


@pytest.fixture(scope="session")
def spec() -> TopologySpec:
    return TopologySpec.model_validate(
        yaml.safe_load((EXAMPLES / "topology-aws-p5-2node.yaml").read_text())
    )


@pytest.fixture
def job() -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "pytorchjob.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="session")
def times(spec: TopologySpec) -> TimeTable:
    return build_time_table(spec)

"""Shared fixtures of the demo's unit tests: the example topology, job and its time table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dynamiccl.api.topology import TopologySpec
from dynamiccl.demo.workload import TimeTable, build_time_table

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


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

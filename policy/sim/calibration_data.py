"""The published measurements the simulator is calibrated on (package data).

`data/calibration/measurements.csv` and `data/calibration/systems/*.yaml` are
copies of the project's shared calibration set; every row keeps its citation
(`source`, `notes`, `nccl_version`).
"""

from __future__ import annotations

import csv
import importlib.resources
from functools import cache
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import TopologySpec, parse_topology
from dynamiccl.policy.sim.physics import Harness, bus_factor
from dynamiccl.policy.sim.system import System, resolve

_DATA = "data/calibration"


class CalibrationRow(BaseModel):
    """One published measurement, with its citation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    system: str
    collective: Collective
    nbytes: int = Field(gt=0)
    algo: Algo | Literal["default"]
    proto: Proto | Literal["default"]
    metric: Literal["busbw_GBps", "time_us"]
    value: float = Field(gt=0)
    nccl_version: str = ""
    notes: str = ""
    source: str

    @property
    def harness(self) -> Harness:
        """The benchmark loop that produced the number (its launch overhead differs).

        nccl-tests with `-G 1` uses CUDA graphs (notes say so); stas00's
        numbers come from a torch.distributed loop (`all_reduce_bench.py`);
        the others are plain nccl-tests.
        """
        if "-G 1" in self.notes:
            return Harness.NCCL_TESTS_GRAPH
        if self.source.startswith("stas00/"):
            return Harness.TORCH
        return Harness.NCCL_TESTS

    def measured_time_us(self, ranks: int) -> float:
        """The measurement as a time in microseconds (busbw converted as nccl-tests does)."""
        if self.metric == "time_us":
            return self.value
        factor = float(bus_factor(self.collective.nccl_id, ranks))
        return self.nbytes * factor / (self.value * 1e3)


def _text(path: str) -> str:
    return importlib.resources.files("dynamiccl.policy").joinpath(path).read_text()


@cache
def load_rows() -> tuple[CalibrationRow, ...]:
    """Every calibration row, in file order."""
    reader = csv.DictReader(_text(f"{_DATA}/measurements.csv").splitlines())
    rows = []
    for raw in reader:
        data = {k: v for k, v in raw.items() if k is not None}
        rows.append(CalibrationRow.model_validate(data))
    return tuple(rows)


@cache
def load_system_specs() -> dict[str, TopologySpec]:
    """The calibration systems by name."""
    root = importlib.resources.files("dynamiccl.policy").joinpath(f"{_DATA}/systems")
    specs = {}
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            spec = parse_topology(yaml.safe_load(entry.read_text()), source=entry.name)
            specs[spec.name] = spec
    return specs


@cache
def calibration_system(name: str) -> System:
    """A calibration system, resolved."""
    return resolve(load_system_specs()[name])

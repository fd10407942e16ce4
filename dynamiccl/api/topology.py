"""The topology spec (docs/simulator.md): the simulator, policy, CLI and node agent speak it."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Intra(StrEnum):
    """Intra-node GPU interconnect."""

    NVSWITCH = "nvswitch"
    NVLINK = "nvlink"
    PCIE = "pcie"


class Fabric(StrEnum):
    """Inter-node network fabric."""

    INFINIBAND = "infiniband"
    ROCE = "roce"
    EFA = "efa"
    ETHERNET = "ethernet"
    NONE = "none"


class TopologyError(ValueError):
    """A topology spec is malformed or inconsistent; the message names the field."""


class TopologySpec(BaseModel):
    """One cluster (or one node, with `nodes: 1`) as the policy sees it.

    Extra optional keys are allowed by the contract (e.g. `container_gpus`,
    `rails`); they are kept, never interpreted silently.
    """

    model_config = ConfigDict(extra="allow", frozen=True, use_enum_values=False)

    name: str = Field(min_length=1)
    gpu: str = Field(min_length=1, description="GPU model, e.g. H100, A100, L40S")
    gpus_per_node: Annotated[int, Field(ge=1, le=72)]
    nodes: Annotated[int, Field(ge=1, le=100_000)]
    intra: Intra
    nvlink_GBps: Annotated[float, Field(ge=0)]  # noqa: N815 - contract spelling
    nvls: bool
    pcie_gen: Annotated[int, Field(ge=1, le=7)]
    nics_per_node: Annotated[int, Field(ge=0, le=64)]
    nic_Gbps: Annotated[float, Field(ge=0)]  # noqa: N815 - contract spelling
    fabric: Fabric
    sharp: bool

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.nvls and self.intra is not Intra.NVSWITCH:
            raise ValueError(f"nvls: true needs intra: nvswitch (got intra: {self.intra.value})")
        if self.intra is Intra.PCIE and self.nvlink_GBps != 0:
            raise ValueError("nvlink_GBps must be 0 with intra: pcie")
        if self.intra is not Intra.PCIE and self.nvlink_GBps <= 0:
            raise ValueError(f"nvlink_GBps must be > 0 with intra: {self.intra.value}")
        if self.sharp and self.fabric is not Fabric.INFINIBAND:
            raise ValueError(f"sharp: true needs fabric: infiniband (got {self.fabric.value})")
        if self.nodes > 1 and (self.fabric is Fabric.NONE or self.nics_per_node == 0):
            raise ValueError("nodes > 1 needs a fabric and nics_per_node >= 1")
        if self.fabric is not Fabric.NONE and self.nics_per_node > 0 and self.nic_Gbps <= 0:
            raise ValueError("nic_Gbps must be > 0 when the node has NICs on a fabric")
        return self

    @property
    def world_size(self) -> int:
        """Total GPUs (ranks) in the topology."""
        return self.gpus_per_node * self.nodes


def parse_topology(data: Any, *, source: str = "topology") -> TopologySpec:
    """Validate a decoded YAML/JSON document; TopologyError names the bad field."""
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping, got {type(data).__name__}")
    try:
        return TopologySpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(spec)"
        raise TopologyError(f"{source}: {where}: {first['msg']}") from exc


def load_topology(path: Path) -> TopologySpec:
    """Read a topology YAML file; TopologyError with the file and field on bad input."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path}: not valid YAML: {exc}") from exc
    return parse_topology(data, source=str(path))

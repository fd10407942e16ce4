"""A job's STATE FEATURES: what the policy conditions its choices on.

Built by the operator from the job, its pods, the nodes they land on and the
nodes' NodeTopology objects; consumed by the policy package (compile-to-table)
and by the sidecar. Three blocks, after the reference material's state vector:

- topology: the tier structure of the job's pod pairs (same node over NVLink,
  same leaf/rack, cross-rack, cross-zone), intra/inter interconnect, NVLS,
  SHARP / in-network aggregation, cluster size, CCL library. The block is a
  superset of the topology spec (docs/simulator.md): ``features.topology.spec()``
  (or ``TopologySpec.model_validate(features.topology.model_dump())``) gives
  the spec the simulator and policy accept.
- workload: parallelism mode and degrees, sync mode, gradient compression and
  the effective message-size factor, model size, compute-to-communication ratio.
- environment: the container boundary (a pod sees fewer GPUs than its node has).

Fields the operator could not observe are listed in ``unknown`` (never silently
defaulted without saying so). Snake_case: this is the policy's contract, like
the topology spec.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dynamiccl.api.topology import Fabric, Intra, TopologySpec

FEATURES_VERSION = 1


class Tier(StrEnum):
    """Communication tier between two ranks, cheapest first."""

    SAME_NODE = "same_node"  # NVLink / PCIe inside one node
    SAME_RACK = "same_rack"  # one leaf (top-of-rack) switch
    CROSS_RACK = "cross_rack"  # through a spine, same zone
    CROSS_ZONE = "cross_zone"  # across availability zones / data halls

    @property
    def level(self) -> int:
        """0 (same node) … 3 (cross zone)."""
        return list(Tier).index(self)


class CclLibrary(StrEnum):
    """The collective library the job uses; anything but NCCL means passthrough."""

    NCCL = "nccl"
    RCCL = "rccl"
    GLOO = "gloo"
    MPI = "mpi"
    OTHER = "other"


class Parallelism(StrEnum):
    """Parallelism mode of the training job."""

    DP = "dp"
    TP = "tp"
    PP = "pp"
    FSDP = "fsdp"
    THREE_D = "3d"
    MOE = "moe"


class SyncMode(StrEnum):
    """When workers wait for each other."""

    BSP = "bsp"
    SSP = "ssp"
    ASP = "asp"
    LOCAL_SGD = "local-sgd"


class Compression(StrEnum):
    """Gradient compression applied by the framework before NCCL sees the bytes."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    ONEBIT = "onebit"
    TOPK = "topk"
    POWERSGD = "powersgd"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class TierMix(_Frozen):
    """Fraction of the job's rank pairs that communicate over each tier (sums to 1)."""

    same_node: Fraction = 1.0
    same_rack: Fraction = 0.0
    cross_rack: Fraction = 0.0
    cross_zone: Fraction = 0.0

    @model_validator(mode="after")
    def _sums_to_one(self) -> Self:
        total = self.same_node + self.same_rack + self.cross_rack + self.cross_zone
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"tier_mix fractions must sum to 1 (got {total:.6f})")
        return self

    def of(self, tier: Tier) -> float:
        """The fraction for one tier."""
        return float(getattr(self, tier.value))


_SPEC_FIELDS = tuple(TopologySpec.model_fields)


class TopologyFeatures(_Frozen):
    """The topology block: every topology-spec field plus the tier structure."""

    # --- the topology spec (docs/simulator.md), describing the nodes the job spans ---
    name: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
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
    # --- tiers and gates ---
    tier_max: Tier = Tier.SAME_NODE
    tier_mix: TierMix = Field(default_factory=TierMix)
    ina_active: bool = False  # in-network aggregation in use (→ passthrough)
    ccl_library: CclLibrary = CclLibrary.NCCL

    @model_validator(mode="after")
    def _valid_spec(self) -> Self:
        try:
            self.spec()
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"topology: {first['msg']}") from exc
        for tier in Tier:
            if tier.level > self.tier_max.level and self.tier_mix.of(tier) > 0.0:
                raise ValueError(f"tier_mix has {tier.value} pairs beyond tier_max")
        if self.tier_mix.of(self.tier_max) <= 0.0:
            raise ValueError(f"tier_max {self.tier_max.value} has no pairs in tier_mix")
        return self

    def spec(self) -> TopologySpec:
        """The topology spec of these nodes (the policy's input; docs/simulator.md)."""
        return TopologySpec.model_validate({k: getattr(self, k) for k in _SPEC_FIELDS})

    @property
    def passthrough(self) -> bool:
        """True when NCCL's own choices must be left alone (INA active or not NCCL)."""
        return self.ina_active or self.ccl_library is not CclLibrary.NCCL


class ParallelDegrees(_Frozen):
    """Degrees of each parallelism dimension (1 = not used)."""

    dp: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    tp: Annotated[int, Field(ge=1, le=1024)] = 1
    pp: Annotated[int, Field(ge=1, le=1024)] = 1
    ep: Annotated[int, Field(ge=1, le=1024)] = 1
    cp: Annotated[int, Field(ge=1, le=1024)] = 1  # context (sequence) parallel

    @property
    def product(self) -> int:
        """dp·tp·pp·cp (ep shares ranks with dp)."""
        return self.dp * self.tp * self.pp * self.cp


DEGREE_NAMES = ("dp", "tp", "pp", "ep", "cp")


def parse_parallelism(value: str) -> tuple[Parallelism, ParallelDegrees]:
    """The ``dynamiccl.io/parallelism`` annotation: ``MODE[:DIM=N,...]``, MODE a
    `Parallelism`, DIM one of `DEGREE_NAMES` (case and spaces ignored), e.g.
    ``3d:tp=8,pp=4,dp=8``. ValueError says what is wrong."""
    mode_text, _, dims_text = value.strip().lower().partition(":")
    try:
        mode = Parallelism(mode_text.strip())
    except ValueError:
        raise ValueError(f"expected one of {', '.join(e.value for e in Parallelism)}") from None
    degrees: dict[str, int] = {}
    for part in dims_text.split(",") if dims_text.strip() else ():
        key, eq, num = (t.strip() for t in part.partition("="))
        if not eq or key not in DEGREE_NAMES:
            raise ValueError(
                f"degree {part.strip()!r} must be DIM=N with DIM in {', '.join(DEGREE_NAMES)}"
            )
        if key in degrees:
            raise ValueError(f"degree {key} given twice")
        if not num.isdigit() or len(num) > 9:
            raise ValueError(f"{key} must be a positive integer (got {num!r})")
        degrees[key] = int(num)
    try:
        return mode, ParallelDegrees.model_validate(degrees)
    except ValidationError as exc:
        raise ValueError(f"degrees out of range: {exc.errors()[0]['msg']}") from None


class WorkloadFeatures(_Frozen):
    """The workload block; all from user annotations (defaults = plain DDP)."""

    parallelism: Parallelism = Parallelism.DP
    degrees: ParallelDegrees = Field(default_factory=ParallelDegrees)
    sync_mode: SyncMode = SyncMode.BSP
    local_steps: Annotated[int, Field(ge=0, le=1_000_000)] = 0  # local-SGD τ, 0 for BSP
    compression: Compression = Compression.NONE
    compression_ratio: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    model_params: Annotated[float, Field(ge=0.0)] = 0.0  # parameter count, 0 = unknown
    c2c_ratio: Annotated[float, Field(ge=0.0)] | None = None  # compute/comm time ratio

    @property
    def effective_message_scale(self) -> float:
        """Bytes NCCL sees per nominal gradient byte (after compression)."""
        return self.compression_ratio


class EnvironmentFeatures(_Frozen):
    """The environment block."""

    container_boundary: bool = False  # a pod holds fewer GPUs than its node has
    node_gpus: Annotated[int, Field(ge=0, le=72)] = 0  # GPUs of the (typical) node, 0 = unknown
    pods_per_node_max: Annotated[int, Field(ge=0, le=10_000)] = 0


class StateFeatures(_Frozen):
    """Everything the policy may condition a job's decisions on."""

    version: int = FEATURES_VERSION
    world_size: Annotated[int, Field(ge=1, le=1_000_000)]
    gpus_per_pod: Annotated[int, Field(ge=0, le=72)]
    replicas: Annotated[int, Field(ge=1, le=100_000)]
    nproc_per_node: Annotated[int, Field(ge=1, le=72)]
    scheduled: bool = False  # True once every pod is bound to a node (tiers observed)
    topology: TopologyFeatures
    workload: WorkloadFeatures = Field(default_factory=WorkloadFeatures)
    environment: EnvironmentFeatures = Field(default_factory=EnvironmentFeatures)
    unknown: Annotated[list[str], Field(max_length=64)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.world_size != self.replicas * self.nproc_per_node:
            raise ValueError(
                f"world_size {self.world_size} != replicas {self.replicas} × "
                f"nproc_per_node {self.nproc_per_node}"
            )
        return self

"""The logical decision table the NCCL plugin executes (issue #5).

Dimensions: collective (``ncclFunc_t`` 0..4) x log2 size bucket x scale class
(from ``nRanks``, ``nNodes``).  Each cell holds up to ``MAX_CHOICES`` ranked
choices and up to ``MAX_CANDIDATES`` exploration candidates.  The policy package
compiles state features into this model, the sidecar encodes it into the shared
memory file (``dynamiccl.sidecar.shm``) and the C plugin executes it.

``size_bucket``, ``scale_class``, ``explore_hash`` and ``decide`` are the single
Python definitions of what ``plugin/src/core.h`` computes; tests run both over
many inputs and compare.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Final, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from dynamiccl.api.nccl import Algo, Collective, Proto

N_BUCKETS: Final = 41
NODE_CLASS_MAX: Final = 15  # ceil(log2(nodes)): 14 = 8 193-16 384 nodes, 15 = more than 16 384
PPN_CLASS_MAX: Final = 7  # ceil(log2(ranks per node)): 7 = 65 and more (e.g. a GB200 NVL72 domain)
N_SCALE_CLASSES: Final = (NODE_CLASS_MAX + 1) * (PPN_CLASS_MAX + 1)  # 128
SCALE_ENCODING: Final = 2  # 1: 32 classes (node class <= 7: every job over 64 nodes shared one)
MAX_SCALES: Final = 8
MAX_CHOICES: Final = 4
MAX_CANDIDATES: Final = 4
WEIGHT_MAX: Final = 65535  # a candidate's largest integer weight (uint16 in the plugin)
MAX_CHUNK_LOG2: Final = 31
NO_HALF_LIFE: Final = 255
_M64: Final = (1 << 64) - 1
_T = TypeVar("_T", bound=BaseModel)


def size_bucket(nbytes: int) -> int:
    """floor(log2(nbytes)) clamped to 0..N_BUCKETS-1 (0 bytes -> bucket 0)."""
    if nbytes <= 0:
        return 0
    return min(nbytes.bit_length() - 1, N_BUCKETS - 1)


def _ceil_log2(n: int) -> int:
    return 0 if n <= 1 else (n - 1).bit_length()


def scale_class(nranks: int, nnodes: int) -> int:
    """8 * node class (ceil log2 of nodes, <= 15) + ranks-per-node class (ceil log2, <= 7)."""
    nnodes = max(nnodes, 1)
    nranks = max(nranks, 1)
    node_class = min(_ceil_log2(nnodes), NODE_CLASS_MAX)
    ppn = max(nranks // nnodes, 1)
    return node_class * (PPN_CLASS_MAX + 1) + min(_ceil_log2(ppn), PPN_CLASS_MAX)


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def explore_hash(  # noqa: PLR0917 -- mirrors plugin/src/core.h
    seed: int, comm_id: int, nranks: int, nnodes: int, coll: int, bucket: int, j: int
) -> int:
    """The rank-identical exploration draw for the j-th call of a (communicator, cell)."""
    h = _mix((seed ^ 0x9E3779B97F4A7C15) & _M64)
    h = _mix(h ^ (comm_id & _M64))
    h = _mix(h ^ (((nranks << 32) & _M64) ^ (nnodes & 0xFFFFFFFF)))
    h = _mix(h ^ ((coll << 8) | bucket))
    return _mix(h ^ (j & _M64))


def eps_at(eps_q16: int, half_life_log2: int, j: int) -> int:
    """Explore probability (Q16) at the j-th call of a cell."""
    if half_life_log2 >= 64:
        return eps_q16
    halvings = j >> half_life_log2
    return 0 if halvings >= 16 else eps_q16 >> halvings


class Choice(BaseModel):
    """One configuration: algorithm, protocol, channels (0 = NCCL's), chunk bytes (0 = NCCL's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algo: Algo
    proto: Proto
    nchannels: int = Field(default=0, ge=0, le=255)
    chunk_bytes: int = Field(default=0, ge=0, le=1 << MAX_CHUNK_LOG2)

    @field_validator("chunk_bytes")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v and v & (v - 1):
            raise ValueError("chunk_bytes must be 0 (NCCL's) or a power of two")
        return v

    @property
    def chunk_log2(self) -> int:
        """0 for NCCL's chunk size, else log2(chunk_bytes)."""
        return self.chunk_bytes.bit_length() - 1 if self.chunk_bytes else 0


class Candidate(Choice):
    """An exploration candidate with its integer weight."""

    weight: int = Field(default=1, ge=1, le=WEIGHT_MAX)


class Cell(BaseModel):
    """Ranked choices and exploration candidates for (collective, size bucket, scale class)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective: Collective
    bucket: int = Field(ge=0, lt=N_BUCKETS)
    scale: int = Field(ge=0, lt=N_SCALE_CLASSES)
    choices: tuple[Choice, ...] = Field(default=(), max_length=MAX_CHOICES)
    candidates: tuple[Candidate, ...] = Field(default=(), max_length=MAX_CANDIDATES)
    explore: float = Field(default=0.0, ge=0.0, le=1.0)

    @property
    def eps_q16(self) -> int:
        """Explore probability as Q16 fixed point (what the plugin stores)."""
        return min(round(self.explore * 65536), 65535)


class ExploreSchedule(BaseModel):
    """Job seed and decay of the explore probability (halves every 2**half_life_log2 calls)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(default=0, ge=0, le=_M64)
    half_life_log2: int | None = Field(default=None, ge=0, le=63)


def _old_encoding_message(encoding: int) -> str:
    return (
        f"scale classes of encoding {encoding} (32 classes, every communicator over 64 nodes in "
        f"one): written by an older DynamICCL, refused (NCCL's own choice); this version needs "
        f"a table compiled in encoding {SCALE_ENCODING}"
    )


def _require_encoding(table: _T) -> _T:
    if "scale_encoding" not in table.model_fields_set:
        err = PydanticCustomError("scale_encoding", _old_encoding_message(1))
        detail = InitErrorDetails(type=err, loc=("scale_encoding",), input=None)
        raise ValidationError.from_exception_data(type(table).__name__, [detail])
    return table


class DecisionTable(BaseModel):
    """A complete table: one version, up to MAX_SCALES scale classes, sparse cells."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1, le=_M64)
    scales: tuple[int, ...] = Field(max_length=MAX_SCALES)
    cells: tuple[Cell, ...] = ()
    explore: ExploreSchedule = ExploreSchedule()
    scale_encoding: int = SCALE_ENCODING  # what `scales` mean; a document must say it

    @field_validator("scale_encoding")
    @classmethod
    def _this_encoding(cls, v: int) -> int:
        if v != SCALE_ENCODING:
            raise ValueError(_old_encoding_message(v))
        return v

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        """Validate a document; one without `scale_encoding` (written before 128 scale classes,
        whose class numbers mean other shapes) is refused, not misread."""
        table = super().model_validate(obj, **kwargs)
        if not isinstance(obj, DecisionTable):
            _require_encoding(table)
        return table

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **kwargs: Any) -> Self:
        """`model_validate` of a JSON document."""
        return _require_encoding(super().model_validate_json(json_data, **kwargs))

    @model_validator(mode="after")
    def _consistent(self) -> DecisionTable:
        if len(set(self.scales)) != len(self.scales):
            raise ValueError("scales must be unique")
        for s in self.scales:
            if not 0 <= s < N_SCALE_CLASSES:
                raise ValueError(f"scale class {s} out of range 0..{N_SCALE_CLASSES - 1}")
        seen: set[tuple[int, int, int]] = set()
        for c in self.cells:
            if c.scale not in self.scales:
                raise ValueError(f"cell scale {c.scale} is not in scales {list(self.scales)}")
            key = (c.collective.nccl_id, c.bucket, c.scale)
            if key in seen:
                raise ValueError(f"duplicate cell {key}")
            seen.add(key)
        return self

    @property
    def digest(self) -> int:
        """64-bit content digest (first 8 bytes of SHA-256 of the canonical JSON)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "little")

    def cell(self, collective: Collective, bucket: int, scale: int) -> Cell | None:
        """The cell for these coordinates, or None (NCCL's own choice)."""
        for c in self.cells:
            if c.collective == collective and c.bucket == bucket and c.scale == scale:
                return c
        return None


Available = Callable[[Choice], bool]


def decide(  # noqa: PLR0917
    table: DecisionTable,
    collective: Collective,
    nbytes: int,
    nranks: int,
    nnodes: int,
    comm_id: int,
    j: int,
    available: Available,
) -> Choice | None:
    """What the plugin forces for the j-th call of this (communicator, collective, bucket).

    `available(choice)` says whether NCCL marked (algo, proto) available (cost != -1.0).
    None means NCCL's own choice stands.
    """
    bucket = size_bucket(nbytes)
    cell = table.cell(collective, bucket, scale_class(nranks, nnodes))
    if cell is None:
        return None
    hl = NO_HALF_LIFE if table.explore.half_life_log2 is None else table.explore.half_life_log2
    eps = eps_at(cell.eps_q16, hl, j)
    if cell.candidates and eps:
        h = explore_hash(table.explore.seed, comm_id, nranks, nnodes, collective.nccl_id, bucket, j)
        if (h & 0xFFFF) < eps:
            total = sum(c.weight for c in cell.candidates)
            r = ((h >> 32) * total) >> 32
            for cand in cell.candidates:
                if r < cand.weight:
                    if available(cand):
                        return cand
                    break
                r -= cand.weight
    for choice in cell.choices:
        if available(choice):
            return choice
    return None

"""`NCCLTuningPolicy` (cluster-scoped, admin-owned): which jobs are tuned, and how.

Every rule the CRD enforces with a CEL rule (``x-kubernetes-validations``) is
also enforced here by a model validator, so Python callers and ``kubectl apply``
reject the same objects (tests/unit/api/test_tuning_policy.py checks both agree).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, ClassVar, Self

from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator

from dynamiccl.api import cron
from dynamiccl.api.k8s import CamelModel, Conditions, LabelSelector
from dynamiccl.api.knob_experiment import EnvKnobExperiment, KnobName
from dynamiccl.api.knob_ranges import (
    KNOB_VALUES,
    PRODUCT_LIMITS,
    consecutive,
    knob_range_text,
    product_text,
)
from dynamiccl.api.learning import LearningStatus
from dynamiccl.api.nccl import Algo, Proto

KIND = "NCCLTuningPolicy"
PLURAL = "nccltuningpolicies"


class Mode(StrEnum):
    """What the policy does to the jobs it matches."""

    OFF = "off"  # nothing injected; TuningRun records why
    OBSERVE = "observe"  # plugin + sidecar measure, NCCL decides (passthrough table)
    STATIC = "static"  # compiled table, no exploration
    LEARNED = "learned"  # compiled table + online exploration


class JobKind(StrEnum):
    """Training-job kinds the operator watches."""

    PYTORCHJOB = "PyTorchJob"
    TRAINJOB = "TrainJob"
    JOBSET = "JobSet"
    MPIJOB = "MPIJob"


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _cel(*rules: dict[str, str]) -> ConfigDict:
    as_json: list[JsonValue] = [dict(r) for r in rules]
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": as_json})


class PolicySelector(CamelModel):
    """Which jobs the policy applies to. Omitted selectors match everything."""

    namespace_selector: LabelSelector | None = None
    job_selector: LabelSelector | None = None
    job_kinds: Annotated[list[JobKind], Field(max_length=4)] = Field(
        default_factory=lambda: list(JobKind)
    )


class IntRange(CamelModel):
    """Inclusive integer range."""

    model_config: ClassVar[ConfigDict] = _cel(
        _rule("self.min <= self.max", "min must be <= max", ".min")
    )

    min: Annotated[int, Field(ge=0)]
    max: Annotated[int, Field(ge=0)]

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min must be <= max (got min {self.min}, max {self.max})")
        return self


class ChannelRange(IntRange):
    """Channel counts the policy may choose (NCCL supports up to 64)."""

    min: Annotated[int, Field(ge=1, le=64)] = 1
    max: Annotated[int, Field(ge=1, le=64)] = 32


class ChunkRange(IntRange):
    """Chunk sizes in bytes the policy may choose (0 = NCCL's own)."""

    min: Annotated[int, Field(ge=0, le=1 << 30)] = 0
    max: Annotated[int, Field(ge=0, le=1 << 30)] = 4 << 20


def _knob_rule(name: KnobName, values: tuple[int, ...]) -> dict[str, str]:
    check = (
        f"v >= {values[0]} && v <= {values[-1]}"
        if consecutive(values)
        else f"v in [{', '.join(map(str, values))}]"
    )
    return _rule(
        f"self.name != '{name.value}' || self.allowed.all(v, {check})",
        f"{name.value} values must be {knob_range_text(name)} (NCCL's documented range)",
        ".allowed",
    )


class EnvKnob(CamelModel):
    """One per-job NCCL env knob: the values the policy may pick from."""

    model_config: ClassVar[ConfigDict] = _cel(
        _rule(
            "!has(self.default) || self.default in self.allowed",
            "default must be one of allowed",
            ".default",
        ),
        *(_knob_rule(n, v) for n, v in KNOB_VALUES.items()),
    )

    name: KnobName
    allowed: Annotated[
        list[Annotated[int, Field(ge=0, le=1 << 34)]], Field(min_length=1, max_length=16)
    ]
    default: Annotated[int, Field(ge=0, le=1 << 34)] | None = None

    @model_validator(mode="after")
    def _default_allowed(self) -> Self:
        if self.default is not None and self.default not in self.allowed:
            raise ValueError(f"default {self.default} must be one of allowed {self.allowed}")
        bad = [v for v in self.allowed if v not in KNOB_VALUES[self.name]]
        if bad:
            raise ValueError(
                f"{self.name.value} values must be {knob_range_text(self.name)} "
                f"(NCCL's documented range), got {bad[0]}"
            )
        return self


def _product_rule(a: KnobName, b: KnobName, limit: int) -> dict[str, str]:
    """CEL: every arm (the defaults, and one knob moved to another allowed value) keeps
    a x b within limit. The bounds first: CEL refuses an int64 overflow."""

    def within(values: str, other: str) -> str:
        return (
            f"(!has({other}.default) || {values}.allowed.all(v, v <= {limit} && "
            f"{other}.default <= {limit} && v * {other}.default <= {limit}))"
        )

    return _rule(
        f"self.envKnobs.all(x, x.name != '{a.value}' || self.envKnobs.all(y, "
        f"y.name != '{b.value}' || ({within('x', 'y')} && {within('y', 'x')})))",
        f"{product_text(a, b, limit)} in any arm: each allowed value of one with the "
        "other's default",
        ".envKnobs",
    )


def product_errors(knobs: Sequence[EnvKnob]) -> list[str]:
    """What `_product_rule` refuses, in words: an allowed value that, with the other
    knob's default, exceeds the pair's limit."""
    by_name = {k.name: k for k in knobs}
    out = []
    for a, b, limit in PRODUCT_LIMITS:
        ka, kb = by_name.get(a), by_name.get(b)
        if ka is None or kb is None:
            continue
        for moved, fixed in ((ka, kb), (kb, ka)):
            if fixed.default is None:
                continue
            bad = [v for v in moved.allowed if v * fixed.default > limit]
            if bad:
                out.append(
                    f"{product_text(a, b, limit)} in any arm: {moved.name.value}={bad[0]} "
                    f"with the default {fixed.name.value}={fixed.default}"
                )
    return out


class Constraints(CamelModel):
    """The action space the admin permits."""

    model_config: ClassVar[ConfigDict] = _cel(
        _rule(
            "self.envKnobs.all(a, self.envKnobs.exists_one(b, b.name == a.name))",
            "envKnobs names must be unique",
            ".envKnobs",
        ),
        *(_product_rule(a, b, limit) for a, b, limit in PRODUCT_LIMITS),
    )

    allowed_algorithms: Annotated[list[Algo], Field(min_length=1, max_length=7)] = Field(
        default_factory=lambda: list(Algo),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    allowed_protocols: Annotated[list[Proto], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: list(Proto),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    channels: ChannelRange = Field(default_factory=ChannelRange)
    chunk_bytes: ChunkRange = Field(default_factory=ChunkRange)
    env_knobs: Annotated[list[EnvKnob], Field(max_length=8)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Self:
        for label, items in (
            ("allowedAlgorithms", self.allowed_algorithms),
            ("allowedProtocols", self.allowed_protocols),
            ("envKnobs", [k.name for k in self.env_knobs]),
        ):
            if len(set(items)) != len(items):
                raise ValueError(f"{label} must not repeat an entry")
        if errors := product_errors(self.env_knobs):
            raise ValueError(errors[0])
        return self


class Exploration(CamelModel):
    """Online exploration budget."""

    budget_calls: Annotated[int, Field(ge=0, le=1_000_000)] = 200  # per (collective, bucket)
    max_candidates: Annotated[int, Field(ge=1, le=16)] = 4
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    # share of jobs (mode learned) that try another value of the declared envKnobs
    env_knob_job_percent: Annotated[int, Field(ge=0, le=100)] = 10
    # hard cap on what exploration may cost a job: measured extra time of its exploratory
    # calls over the time the table's own choice takes, in % of the job's collective time
    # (the sidecar measures it and stops exploring at the cap; sidecar/explore_budget.py)
    budget_percent: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    # a configuration measured faster than NCCL's own becomes every new job's choice in its
    # cell (status.learning findings) only on the word of this many independent jobs (at
    # least 2: one job's sidecar can report anything), from this many namespaces where the
    # hardware class has jobs in that many (fewer namespaces: all of them)
    confirm_jobs: Annotated[int, Field(ge=2, le=100)] = 2
    confirm_namespaces: Annotated[int, Field(ge=1, le=100)] = 2


class Guardrails(CamelModel):
    """When a bucket goes back to NCCL's default."""

    regression_threshold: Annotated[float, Field(gt=0.0, le=1.0)] = 0.05  # 5 % slower → revert
    min_samples: Annotated[int, Field(ge=1, le=100_000)] = 20


ModelVersion = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class ModelRollout(CamelModel):
    """Which model version jobs get, and the canary."""

    model_config: ClassVar[ConfigDict] = _cel(
        _rule(
            "self.canaryPercent == 0 || has(self.canaryVersion)",
            "canaryVersion is required when canaryPercent > 0",
            ".canaryVersion",
        ),
        _rule(
            "!has(self.canaryVersion) || self.canaryVersion != self.version",
            "canaryVersion must differ from version",
            ".canaryVersion",
        ),
    )

    version: ModelVersion = "default"
    canary_version: ModelVersion | None = None
    canary_percent: Annotated[int, Field(ge=0, le=100)] = 0

    @model_validator(mode="after")
    def _canary(self) -> Self:
        if self.canary_percent > 0 and self.canary_version is None:
            raise ValueError("canaryVersion is required when canaryPercent > 0")
        if self.canary_version is not None and self.canary_version == self.version:
            raise ValueError("canaryVersion must differ from version")
        return self


CRON = r"^(@(hourly|daily|weekly|monthly|yearly)|(\S+\s+){4}\S+)$"


class Retraining(CamelModel):
    """When the operator retrains the model from experience."""

    schedule: Annotated[str, Field(max_length=128, pattern=CRON)] | None = None
    min_new_experience: Annotated[int, Field(ge=0, le=10**9)] = 10_000

    @field_validator("schedule")
    @classmethod
    def _fires(cls, value: str | None) -> str | None:
        """A schedule that cannot be parsed or never fires (`0 0 31 2 *`) is refused here:
        CEL cannot run cron, so the operator marks such a policy invalid and the learning
        loop skips it (the CRD's pattern only checks the shape)."""
        if value is not None:
            cron.validate(value)
        return value

    # share of new jobs that get a retrained model's canary (the loop's registry; a
    # spec.model.canaryVersion pin uses spec.model.canaryPercent instead); 0: never canary
    canary_percent: Annotated[int, Field(ge=0, le=100)] = 20


class NCCLTuningPolicySpec(CamelModel):
    """`spec` of an NCCLTuningPolicy."""

    model_config: ClassVar[ConfigDict] = _cel(
        _rule(
            "self.mode != 'learned' || self.exploration.budgetCalls > 0",
            "mode learned needs exploration.budgetCalls > 0",
            ".exploration.budgetCalls",
        )
    )

    selector: PolicySelector = Field(default_factory=PolicySelector)
    priority: Annotated[int, Field(ge=0, le=1000)] = 0
    mode: Mode = Mode.LEARNED
    constraints: Constraints = Field(default_factory=Constraints)
    exploration: Exploration = Field(default_factory=Exploration)
    guardrails: Guardrails = Field(default_factory=Guardrails)
    model: ModelRollout = Field(default_factory=ModelRollout)
    retraining: Retraining = Field(default_factory=Retraining)

    @model_validator(mode="after")
    def _learned_explores(self) -> Self:
        if self.mode is Mode.LEARNED and self.exploration.budget_calls == 0:
            raise ValueError("mode learned needs exploration.budgetCalls > 0")
        return self


class NCCLTuningPolicyStatus(CamelModel):
    """`status` of an NCCLTuningPolicy (written by the operator)."""

    observed_generation: Annotated[int, Field(ge=0)] = 0
    matched_jobs: Annotated[int, Field(ge=0)] = 0
    conditions: Conditions = Field(default_factory=list)
    env_knobs: EnvKnobExperiment | None = None  # the learning loop's knob experiment
    # rows the last retrain used / skipped, and per hardware class what measurements settled
    learning: LearningStatus | None = None

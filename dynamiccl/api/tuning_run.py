"""`TuningRun` (namespaced, one per opted-in job, owned by the job).

`spec` is the operator's record of what it decided for the job (features,
policy, model version, table digest, env knobs, the user's own NCCL env kept as
constraints). `status` is what happened: conditions for every decision a user
may wonder about, exploration progress, the reward summary (measured collective
time vs NCCL-default estimate) and guardrail events, written by the operator
and the job's sidecars.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.k8s import CamelModel, Conditions, ObjectRef
from dynamiccl.api.learning import Config
from dynamiccl.api.table import N_SCALE_CLASSES
from dynamiccl.api.tuning_policy import Mode, ModelVersion

KIND = "TuningRun"
PLURAL = "tuningruns"

# Condition types and reasons (TuningRun.status.conditions).
COND_TUNED = "Tuned"
COND_ANNOTATIONS_VALID = "AnnotationsValid"
COND_POLICY_MATCHED = "PolicyMatched"
COND_SCHEDULED = "Scheduled"


class Phase(StrEnum):
    """Where the job's tuning stands."""

    PENDING = "Pending"  # decided, pods not scheduled yet
    TUNING = "Tuning"  # pods injected, exploring
    CONVERGED = "Converged"  # exploration budget spent
    UNTUNED = "Untuned"  # the job runs with NCCL's own choices (see conditions)


class EnvSetting(CamelModel):
    """One environment variable name/value."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Z_][A-Z0-9_]*$")]
    value: Annotated[str, Field(max_length=1024)]


class TuningRunSpec(CamelModel):
    """What the operator decided for the job."""

    job_ref: ObjectRef
    policy_name: Annotated[str, Field(max_length=253)] = ""
    mode: Mode = Mode.OFF
    model_version: ModelVersion | None = None
    canary: bool = False
    features: StateFeatures | None = None
    table_digest: Annotated[str, Field(max_length=80)] = ""
    config_map_name: Annotated[str, Field(max_length=253)] = ""
    env_knobs: Annotated[list[EnvSetting], Field(max_length=16)] = Field(default_factory=list)
    user_constraints: Annotated[list[EnvSetting], Field(max_length=64)] = Field(
        default_factory=list
    )
    # cells whose first choice came from the hardware class's findings (measured by several
    # jobs faster than NCCL's own), not from the model: policy/runtime/measured.py
    measured_cells: Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=64)] = (
        Field(default_factory=list)
    )
    # a canary job: the promoted version its table was compared with, and the cells where the
    # two choose otherwise (each explores the promoted version's choice: both arms measured)
    arms_baseline: ModelVersion | None = None
    arms: Annotated[list[Arm], Field(max_length=MAX_ARMS)] = Field(default_factory=list)


MAX_ARMS = 64  # cells of a canary job where both versions' choices are measured


class Arm(CamelModel):
    """A cell of a canary job's table whose first choice (`choice`) is not the promoted
    version's (`baseline`): the job explores the promoted version's choice there too, so it
    measures both versions' choices itself (issue 29: the canary judge compares them inside
    the job, operator/learning/within_job.py)."""

    collective: Annotated[str, Field(max_length=32)]
    size_bucket: Annotated[int, Field(ge=0, le=64)]
    scale: Annotated[int, Field(ge=0, lt=N_SCALE_CLASSES)]  # the table's scale class
    choice: Config
    baseline: Config


class BucketReward(CamelModel):
    """Measured vs NCCL-default time of one (collective, size bucket)."""

    collective: Annotated[str, Field(max_length=32)]
    size_bucket: Annotated[int, Field(ge=0, le=64)]
    calls: Annotated[int, Field(ge=0)] = 0
    measured_seconds: Annotated[float, Field(ge=0.0)] = 0.0
    nccl_default_seconds: Annotated[float, Field(ge=0.0)] = 0.0


class CellConfig(CamelModel):
    """A configuration in a cell (communicator shape, collective, size bucket) of the job."""

    collective: Annotated[str, Field(max_length=32)]
    size_bucket: Annotated[int, Field(ge=0, le=64)]
    nranks: Annotated[int, Field(ge=1)]
    nnodes: Annotated[int, Field(ge=1)]
    algo: Annotated[str, Field(max_length=32)]
    proto: Annotated[str, Field(max_length=16)]
    nchannels: Annotated[int, Field(ge=0, le=255)] = 0
    chunk_bytes: Annotated[int, Field(ge=0)] = 0


class StepRefusal(CellConfig):
    """A change the learning loop does not learn from: in this cell its configuration made
    the collectives faster (`kernelSpeedup`) and the job's training step slower
    (`stepSlowdown`, a share: 0.07 = 7 % slower), as most of the job's pods measured."""

    table_version: Annotated[int, Field(ge=0)] = 0
    step_slowdown: Annotated[float, Field(ge=0.0)] = 0.0
    kernel_speedup: Annotated[float, Field(ge=0.0)] = 0.0
    pods_slower: Annotated[int, Field(ge=0)] = 0
    pods_measured: Annotated[int, Field(ge=0)] = 0


class StepReward(CamelModel):
    """The training step: what the user pays for (issue 31).

    `status`: `found` (the sidecars found the repeating step and judged every change by
    it), `learning` (still looking), `none` (no repeating pattern: changes were judged
    on kernel time; `reason` says so). `speedup`: the NCCL-default step (measured under
    a table version that ran NCCL's own choices) times the steps measured, over their
    measured time (> 1: the steps got faster); absent without such a version."""

    status: Annotated[str, Field(max_length=16)]
    reason: Annotated[str, Field(max_length=256)] = ""
    steps: Annotated[int, Field(ge=0)] = 0
    measured_seconds: Annotated[float, Field(ge=0.0)] = 0.0
    nccl_default_seconds: Annotated[float, Field(ge=0.0)] | None = None
    speedup: Annotated[float, Field(ge=0.0)] | None = None
    refused: Annotated[list[StepRefusal], Field(max_length=32)] = Field(default_factory=list)


class RewardSummary(CamelModel):
    """Whole-job reward summary: `speedup` > 1 means tuning helps (the collectives' time);
    `steps` the same for the training step, when the job's sidecars report it."""

    calls: Annotated[int, Field(ge=0)] = 0
    measured_seconds: Annotated[float, Field(ge=0.0)] = 0.0
    nccl_default_seconds: Annotated[float, Field(ge=0.0)] = 0.0
    speedup: Annotated[float, Field(ge=0.0)] | None = None
    buckets: Annotated[list[BucketReward], Field(max_length=512)] = Field(default_factory=list)
    steps: StepReward | None = None


class ExplorationFinding(CellConfig):
    """A configuration the job explored, measured against NCCL's own choice in its cell."""

    calls: Annotated[int, Field(ge=0)] = 0
    speedup: Annotated[float, Field(ge=0.0)] = 0.0  # NCCL's own time / this one's (> 1: faster)


class ExplorationProgress(CamelModel):
    """How far the online exploration got, what it cost and what it found."""

    buckets_total: Annotated[int, Field(ge=0)] = 0
    buckets_converged: Annotated[int, Field(ge=0)] = 0
    exploratory_calls: Annotated[int, Field(ge=0)] = 0
    # measured time of the exploratory calls over what the cell's own choice took, and that
    # as a share of the job's collective time (the policy's exploration.budgetPercent caps it)
    cost_seconds: Annotated[float, Field(ge=0.0)] = 0.0
    cost_percent: Annotated[float, Field(ge=0.0)] = 0.0
    found: Annotated[list[ExplorationFinding], Field(max_length=32)] = Field(default_factory=list)


class GuardrailEvent(CamelModel):
    """A bucket returned to NCCL's default because the choice measured worse."""

    collective: Annotated[str, Field(max_length=32)]
    size_bucket: Annotated[int, Field(ge=0, le=64)]
    regression: Annotated[float, Field(ge=0.0)]
    time: Annotated[str, Field(max_length=64)] = ""
    message: Annotated[str, Field(max_length=1024)] = ""


class TuningRunStatus(CamelModel):
    """What happened to the job's tuning."""

    phase: Phase = Phase.PENDING
    observed_generation: Annotated[int, Field(ge=0)] = 0
    table_version: Annotated[int, Field(ge=0)] = 0
    conditions: Conditions = Field(default_factory=list)
    exploration: ExplorationProgress = Field(default_factory=ExplorationProgress)
    reward: RewardSummary = Field(default_factory=RewardSummary)
    guardrail_events: Annotated[list[GuardrailEvent], Field(max_length=100)] = Field(
        default_factory=list
    )

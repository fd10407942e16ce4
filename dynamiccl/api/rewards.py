"""Reward records: what a job's sidecar measured, as it reports it to the operator.

The sidecar aggregates the profiler's per-call times per (collective, size
bucket, scale, configuration) and sends them to the operator's reward-ingest
endpoint (`POST /v1/rewards`) as one `RewardBatch`. A batch carries an
idempotency key `<pod-uid>/<sequence>`: the sidecar persists the sequence, so a
retry of the same batch (after a timeout or an operator restart) carries the
same key and the operator stores it at most once (docs/learning-loop.md, 'Reward batches').

Every name carries its unit (`_us`, `_bytes`, `_GBps`); every string and list
is bounded so the ingest endpoint can reject oversized input before storing
anything. The wire format is JSON; `RewardBatch.model_validate_json` is the
one parser (scalars strict: no silent coercion of "1" to 1, no NaN/inf).
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Annotated, Final, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from dynamiccl.api.nccl import Algo, Collective, Proto

# --- limits (the ingest endpoint enforces MAX_BATCH_BODY_BYTES before parsing) --
MAX_RECORDS_PER_BATCH: Final = 512
MAX_EVENTS_PER_BATCH: Final = 64
MAX_BATCH_BODY_BYTES: Final = 512 * 1024
MAX_NAME_LENGTH: Final = 253  # DNS-1123 subdomain (object names)
MAX_NAMESPACE_LENGTH: Final = 63  # DNS-1123 label
MAX_KIND_LENGTH: Final = 63
MAX_UID_LENGTH: Final = 64
MAX_MODEL_VERSION_LENGTH: Final = 63
MAX_MESSAGE_LENGTH: Final = 256
MAX_SEQUENCE: Final = 2**53  # exact in a JSON double
MAX_NBYTES: Final = 2**44  # 16 TiB, far above any collective
MAX_TIME_US: Final = 1e12  # ~11.6 days
# 1 ns (the sidecar clamps to the same floor, sidecar/aggregate.py): no collective is faster,
# and every ratio of two times stays finite (at most MAX_TIME_US / MIN_TIME_US = 1e15)
MIN_TIME_US: Final = 1e-3
MAX_BUSBW_GBPS: Final = 1e6
MAX_NCHANNELS: Final = 64  # NCCL's MAXCHANNELS
MAX_CHUNK_BYTES: Final = 2**30
MAX_CALLS: Final = 2**48
MAX_USER_TAG: Final = 2**64 - 1  # a uint64_t
MAX_SIZE_BUCKET: Final = 64

DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
UID_PATTERN: Final = r"^[0-9A-Za-z][0-9A-Za-z-]*$"
KIND_PATTERN: Final = r"^[A-Z][A-Za-z0-9]*$"
MODEL_VERSION_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]*$"  # as NCCLTuningPolicy model.version
IDEMPOTENCY_KEY_PATTERN: Final = r"^[0-9A-Za-z][0-9A-Za-z-]*/[0-9]{1,16}$"

ObjectName = Annotated[
    str, Strict(), Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)
]
NamespaceName = Annotated[
    str, Strict(), Field(min_length=1, max_length=MAX_NAMESPACE_LENGTH, pattern=DNS_LABEL_PATTERN)
]
Uid = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_UID_LENGTH, pattern=UID_PATTERN)]
TimeUs = Annotated[float, Strict(), Field(ge=MIN_TIME_US, le=MAX_TIME_US, allow_inf_nan=False)]
ModelVersionName = Annotated[
    str,
    Strict(),
    Field(min_length=1, max_length=MAX_MODEL_VERSION_LENGTH, pattern=MODEL_VERSION_PATTERN),
]

_MODEL_CONFIG: Final = ConfigDict(extra="forbid", frozen=True)


class JobRef(BaseModel):
    """The training job (the top-level owner of the pods: PyTorchJob, TrainJob, MPIJob...)."""

    model_config = _MODEL_CONFIG

    namespace: NamespaceName
    kind: Annotated[
        str, Strict(), Field(min_length=1, max_length=MAX_KIND_LENGTH, pattern=KIND_PATTERN)
    ]
    name: ObjectName
    uid: Uid


class PodRef(BaseModel):
    """The pod whose sidecar sent the batch (must be the pod its token is bound to)."""

    model_config = _MODEL_CONFIG

    name: ObjectName
    uid: Uid


class Origin(StrEnum):
    """Why the plugin used the configuration of a record."""

    TABLE = "table"  # the compiled decision table's choice
    EXPLORE = "explore"  # the online tuner's exploration schedule
    DEFAULT = "default"  # NCCL's own choice (passthrough or guardrail)


class RewardRecord(BaseModel):
    """Aggregated measurements of one configuration in one bucket, at one scale.

    `nchannels == 0` / `chunk_bytes == 0` mean "NCCL's default". `size_bucket`
    is the decision table's (log2) size bucket index, and [`nbytes_min`,
    `nbytes_max`] the inclusive byte range of the calls it aggregates.
    `nccl_default_time_us` is the sidecar's estimate of what NCCL's own choice
    costs in this bucket (the baseline to beat).
    """

    model_config = _MODEL_CONFIG

    collective: Collective
    size_bucket: Annotated[int, Strict(), Field(ge=0, le=MAX_SIZE_BUCKET)]
    nbytes_min: Annotated[int, Strict(), Field(ge=0, le=MAX_NBYTES)]
    nbytes_max: Annotated[int, Strict(), Field(ge=0, le=MAX_NBYTES)]
    nranks: Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
    nnodes: Annotated[int, Strict(), Field(ge=1, le=100_000)]
    algo: Algo
    proto: Proto
    nchannels: Annotated[int, Strict(), Field(ge=0, le=MAX_NCHANNELS)]
    chunk_bytes: Annotated[int, Strict(), Field(ge=0, le=MAX_CHUNK_BYTES)]
    origin: Origin
    # the application's tag of the calls (NCCL profiler v7's userTag; 0 = untagged): a label
    # that tells a job's communicators and phases apart
    user_tag: Annotated[int, Strict(), Field(ge=0, le=MAX_USER_TAG)] = 0
    count: Annotated[int, Strict(), Field(ge=1, le=MAX_CALLS)]
    mean_time_us: TimeUs
    p50_time_us: TimeUs
    p99_time_us: TimeUs
    busbw_GBps: Annotated[float, Strict(), Field(ge=0, le=MAX_BUSBW_GBPS, allow_inf_nan=False)]  # noqa: N815
    nccl_default_time_us: TimeUs

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.nbytes_min > self.nbytes_max:
            raise ValueError(f"nbytes_min {self.nbytes_min} > nbytes_max {self.nbytes_max}")
        if self.nnodes > self.nranks:
            raise ValueError(f"nnodes {self.nnodes} > nranks {self.nranks}")
        if self.p50_time_us > self.p99_time_us:
            raise ValueError(f"p50_time_us {self.p50_time_us} > p99_time_us {self.p99_time_us}")
        return self

    def key(self) -> tuple[object, ...]:
        """What identifies the record within a batch (everything but the measurements)."""
        return (
            self.collective,
            self.size_bucket,
            self.nbytes_min,
            self.nbytes_max,
            self.nranks,
            self.nnodes,
            self.algo,
            self.proto,
            self.nchannels,
            self.chunk_bytes,
            self.origin,
            self.user_tag,
        )

    @property
    def speedup(self) -> float:
        """NCCL-default estimate / measured mean (> 1: faster than NCCL's own choice)."""
        return self.nccl_default_time_us / self.mean_time_us


class EventKind(StrEnum):
    """Online-tuner events the TuningRun status reports."""

    GUARDRAIL_REVERT = "guardrail_revert"  # a choice measured worse than NCCL's default
    CHANGE_DETECTED = "change_detected"  # CUSUM re-opened exploration
    EXPLORATION_DONE = "exploration_done"


class TunerEvent(BaseModel):
    """One online-tuner event in a bucket."""

    model_config = _MODEL_CONFIG

    kind: EventKind
    collective: Collective
    size_bucket: Annotated[int, Strict(), Field(ge=0, le=MAX_SIZE_BUCKET)]
    nbytes_min: Annotated[int, Strict(), Field(ge=0, le=MAX_NBYTES)]
    nbytes_max: Annotated[int, Strict(), Field(ge=0, le=MAX_NBYTES)]
    call_index: Annotated[int, Strict(), Field(ge=0, le=MAX_CALLS)]
    regression: Annotated[float, Strict(), Field(ge=0, le=1e6, allow_inf_nan=False)] = 0.0
    message: Annotated[str, Strict(), Field(max_length=MAX_MESSAGE_LENGTH)] = ""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.nbytes_min > self.nbytes_max:
            raise ValueError(f"nbytes_min {self.nbytes_min} > nbytes_max {self.nbytes_max}")
        return self


class StepStatus(StrEnum):
    """Whether the pod's sidecar found the training step (sidecar/steps.py)."""

    FOUND = "found"
    LEARNING = "learning"
    NONE = "none"  # no repeating pattern: changes are judged on kernel time alone


class StepTimes(BaseModel):
    """The training steps the pod's sidecar measured under the batch's table version:
    `steps` so far, their median and robust spread (1.4826 MAD) over the last ones
    (sidecar/step_judge.py), and `period`, the calls per step of those steps (a detector
    that relearned its step measures another step: versions are compared only at the same
    period; None from senders before it). Optional: senders before issue 31 do not send it."""

    model_config = _MODEL_CONFIG

    status: StepStatus
    steps: Annotated[int, Strict(), Field(ge=0, le=MAX_CALLS)] = 0
    median_us: TimeUs | None = None
    spread_us: (
        Annotated[float, Strict(), Field(ge=0, le=MAX_TIME_US, allow_inf_nan=False)] | None
    ) = None
    period: Annotated[int, Strict(), Field(ge=1, le=MAX_CALLS)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.period is not None and not self.steps:
            raise ValueError("period needs steps > 0")
        if (self.steps > 0) != (self.median_us is not None):
            raise ValueError("median_us is given exactly when steps > 0")
        if self.spread_us is not None and self.median_us is None:
            raise ValueError("spread_us needs median_us")
        if self.steps and self.status is not StepStatus.FOUND:
            raise ValueError("steps > 0 needs status 'found'")
        return self


class RewardBatch(BaseModel):
    """The body of `POST /v1/rewards`: one pod's rewards since its previous batch."""

    model_config = _MODEL_CONFIG

    idempotency_key: Annotated[
        str,
        Strict(),
        Field(
            min_length=3,
            max_length=MAX_UID_LENGTH + 17,
            pattern=IDEMPOTENCY_KEY_PATTERN,
            description="<pod-uid>/<sequence>; a retry carries the same key and payload",
        ),
    ]
    job: JobRef
    pod: PodRef
    model_version: ModelVersionName
    table_version: Annotated[int, Strict(), Field(ge=0, le=MAX_SEQUENCE)]
    records: Annotated[tuple[RewardRecord, ...], Field(max_length=MAX_RECORDS_PER_BATCH)]
    events: Annotated[tuple[TunerEvent, ...], Field(max_length=MAX_EVENTS_PER_BATCH)] = ()
    steps: StepTimes | None = None  # issue 31: the step time under table_version

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        prefix, _, seq = self.idempotency_key.partition("/")
        if prefix != self.pod.uid:
            raise ValueError("idempotency_key must start with the pod uid: '<pod.uid>/<sequence>'")
        if int(seq) > MAX_SEQUENCE:
            raise ValueError(f"idempotency_key sequence exceeds {MAX_SEQUENCE}")
        if not self.records and not self.events:
            raise ValueError("a batch carries at least one record or event")
        seen: set[tuple[object, ...]] = set()
        for i, rec in enumerate(self.records):
            k = rec.key()
            if k in seen:
                raise ValueError(f"records[{i}] repeats the key of an earlier record")
            seen.add(k)
        return self

    @property
    def calls(self) -> int:
        """Collective calls the batch covers."""
        return sum(r.count for r in self.records)


def payload_sha256(batch: RewardBatch) -> str:
    """Digest of the canonical JSON of a batch (equal payloads ⇔ equal digests).

    The store keeps it next to the idempotency key: a retry with the same key
    and digest is a duplicate, the same key with another digest is a conflict.
    """
    # without step times a batch digests as before the field existed (a retry across an
    # upgrade of the operator stays a duplicate, not a conflict)
    skip = {"steps"} if batch.steps is None else None
    return hashlib.sha256(batch.model_dump_json(exclude=skip).encode()).hexdigest()


class ExperienceRow(BaseModel):
    """One stored reward record with its provenance, as training reads it back.

    `id` grows monotonically with insertion: training resumes from the last id
    it consumed (`experience_cursor` of the model version it produced).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int
    namespace: str
    job_kind: str
    job_name: str
    job_uid: str
    pod_uid: str
    model_version: str
    table_version: int
    received_unix_s: float
    record: RewardRecord


class IngestResponse(BaseModel):
    """Body of a 200 answer: how many records this request stored (0 on a duplicate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accepted: Annotated[int, Strict(), Field(ge=0)]
    duplicate: bool


class IngestError(BaseModel):
    """Body of every 4xx/5xx answer of the ingest endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    error: str
    detail: str = ""


class BucketSummary(BaseModel):
    """One (collective, size bucket, scale) of a job, over all stored records."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective: Collective
    size_bucket: int
    nbytes_min: int
    nbytes_max: int
    nranks: int
    nnodes: int
    calls: int
    mean_time_us: float  # call-weighted mean of the measured means
    nccl_default_time_us: float  # call-weighted mean of the NCCL-default estimates
    speedup: float  # nccl_default_time_us / mean_time_us
    configurations_tried: int
    explored_calls: int


class JobRewardSummary(BaseModel):
    """What the experience store knows about one job (feeds its TuningRun status)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_uid: str
    batches: int
    records: int
    calls: int
    speedup: float | None  # call-weighted over buckets; None without records
    buckets: tuple[BucketSummary, ...]
    exploratory_calls: int
    buckets_converged: int  # buckets with an exploration_done event
    guardrail_events: int
    change_events: int
    recent_events: tuple[TunerEvent, ...]  # newest first, at most 20
    last_received_unix_s: float | None

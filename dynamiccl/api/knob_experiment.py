"""Per-job env knobs, learned across jobs: the experiment's state in the policy status.

A knob such as `NCCL_NTHREADS` is read once, at NCCL's init, so one job
measures one value. The operator assigns each opted-in job of a `learned`
policy an *arm* (a full assignment of the policy's declared knobs), the
learning loop compares the jobs' measured collective times per hardware
*cohort*, and writes what it found into `NCCLTuningPolicy.status.envKnobs`;
the operator reads it back for the next job (docs/policy.md).
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from dynamiccl.api.k8s import CamelModel


def stamp_unix_s(value: object) -> float | None:
    """An RFC 3339 UTC stamp ("...Z") as a Unix time; None when it is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class KnobName(StrEnum):
    """Per-job NCCL environment knobs the policy may set at launch."""

    NCCL_NTHREADS = "NCCL_NTHREADS"
    NCCL_BUFFSIZE = "NCCL_BUFFSIZE"
    NCCL_MIN_NCHANNELS = "NCCL_MIN_NCHANNELS"
    NCCL_MAX_NCHANNELS = "NCCL_MAX_NCHANNELS"
    # the network's (docs/policy.md §7 says on which fabrics each one is tried)
    NCCL_IB_QPS_PER_CONNECTION = "NCCL_IB_QPS_PER_CONNECTION"
    NCCL_IB_SPLIT_DATA_ON_QPS = "NCCL_IB_SPLIT_DATA_ON_QPS"
    NCCL_NCHANNELS_PER_NET_PEER = "NCCL_NCHANNELS_PER_NET_PEER"
    NCCL_P2P_NET_CHUNKSIZE = "NCCL_P2P_NET_CHUNKSIZE"
    NCCL_SOCKET_NTHREADS = "NCCL_SOCKET_NTHREADS"
    NCCL_NSOCKS_PERTHREAD = "NCCL_NSOCKS_PERTHREAD"
    NCCL_CROSS_NIC = "NCCL_CROSS_NIC"


MAX_ARMS = 33  # the baseline + up to 32 one-knob deviations
MAX_COHORTS = 64


class KnobValue(CamelModel):
    """One knob's value in an arm."""

    name: KnobName
    value: Annotated[int, Field(ge=0, le=1 << 34)]


class ArmState(StrEnum):
    """Where an arm stands against the baseline."""

    BASELINE = "baseline"  # the declared defaults: what every other arm is compared with
    EXPLORING = "exploring"  # not enough jobs, or the interval still contains 1.0
    BETTER = "better"  # the whole interval of its speedup is above 1.0
    WORSE = "worse"  # the whole interval is below 1.0: never assigned again
    NO_EFFECT = "no-effect"  # enough jobs, no significant difference: no longer explored


class ArmResult(CamelModel):
    """Measured outcome of one arm in one cohort."""

    knobs: Annotated[list[KnobValue], Field(max_length=8)] = Field(default_factory=list)
    jobs: Annotated[int, Field(ge=0)] = 0
    speedup: Annotated[float, Field(gt=0.0)] | None = None  # geometric mean vs the baseline
    low: Annotated[float, Field(gt=0.0)] | None = None  # 95 % simultaneous interval
    high: Annotated[float, Field(gt=0.0)] | None = None
    state: ArmState = ArmState.EXPLORING


class SkippedKnob(CamelModel):
    """A declared knob whose other values are not tried on a hardware class, and why."""

    name: KnobName
    reason: Annotated[str, Field(max_length=256)]


class CohortExperiment(CamelModel):
    """The experiment on one hardware class (jobs whose nodes look alike)."""

    cohort: Annotated[str, Field(min_length=1, max_length=64)]
    description: Annotated[str, Field(max_length=256)] = ""
    arms: Annotated[list[ArmResult], Field(max_length=MAX_ARMS)] = Field(default_factory=list)
    adopted: Annotated[list[KnobValue], Field(max_length=8)] | None = None
    # knobs that cannot matter on this class (e.g. the IB transport's on a TCP fabric):
    # their declared defaults stay in every arm, their other values are never tried
    skipped: Annotated[list[SkippedKnob], Field(max_length=8)] = Field(default_factory=list)


class EnvKnobExperiment(CamelModel):
    """`status.envKnobs` of an NCCLTuningPolicy (written by the learning loop)."""

    updated: Annotated[str, Field(max_length=64)] = ""
    cohorts: Annotated[list[CohortExperiment], Field(max_length=MAX_COHORTS)] = Field(
        default_factory=list
    )

    @property
    def updated_unix_s(self) -> float | None:
        """`updated` as a Unix time (None: unset or unreadable)."""
        return stamp_unix_s(self.updated)

    def cohort(self, cohort: str) -> CohortExperiment | None:
        """The entry for one cohort, if the loop has written one."""
        return next((e for e in self.cohorts if e.cohort == cohort), None)

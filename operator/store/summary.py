"""Reward summaries from grouped experience rows (pure; the store runs the SQL).

`summarise` turns the per-(bucket, configuration, origin) sums of one job into
the `JobRewardSummary` its TuningRun status shows; `JobOutcome` is one job's
result under one model version, what canary promotion compares.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl.api.nccl import Collective
from dynamiccl.api.rewards import (
    BucketSummary,
    EventKind,
    JobRewardSummary,
    Origin,
    TunerEvent,
)

RECENT_EVENTS: Final = 20


@dataclass(frozen=True)
class JobOutcome:
    """A job's measured result under one model version (exploration calls excluded)."""

    job_uid: str
    model_version: str
    calls: int
    measured_us: float  # sum over calls of the measured time
    nccl_default_us: float  # sum over calls of the NCCL-default estimate
    hardware_class: str = ""  # the job's (job_features; "" before its features are stored)

    @property
    def speedup(self) -> float:
        """NCCL-default time / measured time (> 1: the model beat NCCL's own choice)."""
        return self.nccl_default_us / self.measured_us if self.measured_us > 0 else 0.0


def summarise(
    job_uid: str,
    groups: list[tuple[Any, ...]],
    brow: tuple[Any, ...],
    events: list[tuple[Any, ...]],
) -> JobRewardSummary:
    acc: dict[tuple[str, int, int, int], dict[str, float]] = defaultdict(
        lambda: {"calls": 0, "t": 0.0, "d": 0.0, "lo": float("inf"), "hi": 0.0, "explored": 0}
    )
    configs: dict[tuple[str, int, int, int], set[tuple[object, ...]]] = defaultdict(set)
    for g in groups:
        coll, bucket, nranks, nnodes, algo, proto, nch, chunk, origin = g[:9]
        key = (str(coll), int(bucket), int(nranks), int(nnodes))
        a = acc[key]
        calls = int(g[11])
        a["calls"] += calls
        a["t"] += float(g[12])
        a["d"] += float(g[13])
        a["lo"] = min(a["lo"], int(g[9]))
        a["hi"] = max(a["hi"], int(g[10]))
        if origin == Origin.EXPLORE.value:
            a["explored"] += calls
        configs[key].add((algo, proto, nch, chunk))
    buckets = tuple(
        BucketSummary(
            collective=Collective(k[0]),
            size_bucket=k[1],
            nbytes_min=int(a["lo"]),
            nbytes_max=int(a["hi"]),
            nranks=k[2],
            nnodes=k[3],
            calls=int(a["calls"]),
            mean_time_us=a["t"] / a["calls"],
            nccl_default_time_us=a["d"] / a["calls"],
            speedup=a["d"] / a["t"],
            configurations_tried=len(configs[k]),
            explored_calls=int(a["explored"]),
        )
        for k, a in sorted(acc.items())
    )
    total_t = sum(a["t"] for a in acc.values())
    total_d = sum(a["d"] for a in acc.values())
    parsed = [
        TunerEvent(
            kind=EventKind(str(e[0])),
            collective=Collective(str(e[1])),
            size_bucket=int(e[2]),
            nbytes_min=int(e[3]),
            nbytes_max=int(e[4]),
            call_index=int(e[5]),
            regression=float(e[6]),
            message=str(e[7]),
        )
        for e in events
    ]
    converged = {
        (e.collective, e.size_bucket) for e in parsed if e.kind is EventKind.EXPLORATION_DONE
    }
    return JobRewardSummary(
        job_uid=job_uid,
        batches=int(brow[0] or 0),
        records=int(brow[1] or 0),
        calls=sum(b.calls for b in buckets),
        speedup=(total_d / total_t) if total_t > 0 else None,
        buckets=buckets,
        exploratory_calls=sum(b.explored_calls for b in buckets),
        buckets_converged=len(converged),
        guardrail_events=sum(1 for e in parsed if e.kind is EventKind.GUARDRAIL_REVERT),
        change_events=sum(1 for e in parsed if e.kind is EventKind.CHANGE_DETECTED),
        recent_events=tuple(parsed[:RECENT_EVENTS]),
        last_received_unix_s=None if brow[2] is None else float(brow[2]),
    )

"""A job's stored rewards as its TuningRun status (reward summary, exploration, guardrails).

Maps the store's `JobRewardSummary` (per collective, size bucket and scale) to
the TuningRun status shapes of dynamiccl/api/tuning_run.py (per collective and
size bucket; scales summed), bounded to the CRD's list limits.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl.api.rewards import EventKind, JobRewardSummary, Origin
from dynamiccl.api.tuning_run import (
    BucketReward,
    ExplorationFinding,
    ExplorationProgress,
    GuardrailEvent,
    RewardSummary,
    StepRefusal,
    StepReward,
)
from dynamiccl.operator.learning.step_verdicts import StepReport

MAX_BUCKETS: Final = 512
MAX_GUARDRAIL_EVENTS: Final = 100
MAX_REFUSED: Final = 32
US_PER_S: Final = 1e6


@dataclass(frozen=True)
class RewardStatus:
    """The status parts the reward pipeline owns."""

    reward: RewardSummary
    exploration: ExplorationProgress
    guardrail_events: list[GuardrailEvent]

    def patch(self) -> dict[str, Any]:
        """A merge patch for the TuningRun's `status` subresource (camelCase)."""
        return {
            "status": {
                "reward": self.reward.model_dump(mode="json", by_alias=True),
                "exploration": self.exploration.model_dump(mode="json", by_alias=True),
                "guardrailEvents": [
                    e.model_dump(mode="json", by_alias=True) for e in self.guardrail_events
                ],
            }
        }


def _finite(x: float) -> float | None:
    """x, or None when it is not a finite number (JSON has no Infinity: the API server
    refuses a patch carrying one)."""
    return x if math.isfinite(x) else None


Group = tuple[Any, ...]  # operator/store/coverage.py `job_configs` row
MAX_FOUND: Final = 32


def _cells(groups: Sequence[Group]) -> dict[tuple[Any, ...], list[Group]]:
    cells: dict[tuple[Any, ...], list[Group]] = defaultdict(list)
    for g in groups:
        cells[tuple(g[:4])].append(g)
    return cells


def exploration_cost(groups: Sequence[Group]) -> tuple[float, float, list[ExplorationFinding]]:
    """(cost us, collective time us, findings) of one job's exploratory calls.

    Cost: per cell, the explored configurations' time over the cell's own
    (non-exploratory) mean. Findings: every explored configuration against NCCL's
    own time in the cell (measured when the job has NCCL-own calls there, else the
    sidecar's NCCL-default estimate), fastest first.
    """
    cost = total = 0.0
    found: list[ExplorationFinding] = []
    for key, rows in _cells(groups).items():
        total += sum(float(r[10]) for r in rows)
        own = [r for r in rows if r[8] != Origin.EXPLORE.value]
        nccl = [r for r in own if r[8] == Origin.DEFAULT.value] or rows
        ref_own = sum(float(r[10]) for r in own) / max(sum(int(r[9]) for r in own), 1)
        ref_nccl = (
            sum(float(r[10]) for r in nccl) / sum(int(r[9]) for r in nccl)
            if nccl is not rows
            else sum(float(r[11]) for r in rows) / max(sum(int(r[9]) for r in rows), 1)
        )
        for r in rows:
            if r[8] != Origin.EXPLORE.value:
                continue
            calls, t = int(r[9]), float(r[10])
            if own:
                cost += max(t - calls * ref_own, 0.0)
            found.append(
                ExplorationFinding(
                    collective=str(key[0]),
                    size_bucket=int(key[1]),
                    nranks=int(key[2]),
                    nnodes=int(key[3]),
                    algo=str(r[4]),
                    proto=str(r[5]),
                    nchannels=int(r[6]),
                    chunk_bytes=int(r[7]),
                    calls=calls,
                    speedup=ref_nccl * calls / t if t else 0.0,
                )
            )
    found.sort(key=lambda f: -f.speedup)
    return cost, total, found[:MAX_FOUND]


def step_reward(rep: StepReport | None) -> StepReward | None:
    """The TuningRun's `status.reward.steps` (None: no batch of the job carried step times)."""
    if rep is None or rep.status is None:
        return None
    refused = [
        StepRefusal(
            collective=r.cell[0], size_bucket=r.cell[1], nranks=r.cell[2], nnodes=r.cell[3],
            algo=r.config[0], proto=r.config[1], nchannels=r.config[2], chunk_bytes=r.config[3],
            table_version=r.table_version, step_slowdown=max(r.step_slowdown, 0.0),
            kernel_speedup=r.kernel_speedup, pods_slower=r.pods_slower,
            pods_measured=r.pods_measured,
        )
        for r in rep.refusals[:MAX_REFUSED]
    ]  # fmt: skip
    default = rep.nccl_default_us
    speedup = rep.speedup
    return StepReward(
        status=rep.status.value,
        reason=rep.reason,
        steps=rep.steps,
        measured_seconds=rep.measured_us / US_PER_S,
        nccl_default_seconds=None if default is None else default / US_PER_S,
        speedup=None if speedup is None else _finite(speedup),
        refused=refused,
    )


def reward_status(
    summary: JobRewardSummary,
    configs: Sequence[Group] | None = None,
    steps: StepReport | None = None,
) -> RewardStatus:
    """Fold scales together per (collective, size bucket); newest guardrail events first.

    `configs` (the job's per-configuration groups) adds what exploration cost and found;
    `steps` what the job's step times say (operator/learning/step_verdicts.py).
    """
    acc: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for b in summary.buckets:
        if not (math.isfinite(b.mean_time_us) and math.isfinite(b.nccl_default_time_us)):
            continue  # rows stored before the ingest refused non-finite values
        a = acc[(b.collective.value, b.size_bucket)]
        a[0] += b.calls
        a[1] += b.mean_time_us * b.calls
        a[2] += b.nccl_default_time_us * b.calls
    buckets = [
        BucketReward(
            collective=coll,
            size_bucket=bucket,
            calls=int(a[0]),
            measured_seconds=a[1] / US_PER_S,
            nccl_default_seconds=a[2] / US_PER_S,
        )
        for (coll, bucket), a in sorted(acc.items())
    ][:MAX_BUCKETS]
    measured = sum(a[1] for a in acc.values()) / US_PER_S
    default = sum(a[2] for a in acc.values()) / US_PER_S
    reward = RewardSummary(
        calls=summary.calls,
        measured_seconds=measured,
        nccl_default_seconds=default,
        speedup=_finite(default / measured) if measured > 0 else None,
        buckets=buckets,
        steps=step_reward(steps),
    )
    cost, total, found = exploration_cost(configs or [])
    exploration = ExplorationProgress(
        buckets_total=len(acc),
        buckets_converged=min(summary.buckets_converged, len(acc)),
        exploratory_calls=summary.exploratory_calls,
        cost_seconds=cost / US_PER_S,
        cost_percent=100.0 * cost / total if total > 0 else 0.0,
        found=found,
    )
    guardrails = [
        GuardrailEvent(
            collective=e.collective.value,
            size_bucket=e.size_bucket,
            regression=e.regression,
            message=e.message or f"reverted to NCCL's default at call {e.call_index}",
        )
        for e in summary.recent_events
        if e.kind is EventKind.GUARDRAIL_REVERT
    ][:MAX_GUARDRAIL_EVENTS]
    return RewardStatus(reward, exploration, guardrails)

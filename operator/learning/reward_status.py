"""A job's stored rewards as its TuningRun status (reward summary, exploration, guardrails).

Maps the store's `JobRewardSummary` (per collective, size bucket and scale) to
the TuningRun status shapes of dynamiccl/api/tuning_run.py (per collective and
size bucket; scales summed), bounded to the CRD's list limits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl.api.rewards import EventKind, JobRewardSummary
from dynamiccl.api.tuning_run import (
    BucketReward,
    ExplorationProgress,
    GuardrailEvent,
    RewardSummary,
)

MAX_BUCKETS: Final = 512
MAX_GUARDRAIL_EVENTS: Final = 100
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


def reward_status(summary: JobRewardSummary) -> RewardStatus:
    """Fold scales together per (collective, size bucket); newest guardrail events first."""
    acc: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for b in summary.buckets:
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
        speedup=(default / measured) if measured > 0 else None,
        buckets=buckets,
    )
    exploration = ExplorationProgress(
        buckets_total=len(acc),
        buckets_converged=min(summary.buckets_converged, len(acc)),
        exploratory_calls=summary.exploratory_calls,
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

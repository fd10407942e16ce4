"""Store summary → TuningRun status: scales folded, seconds, camelCase patch."""

from __future__ import annotations

import pytest

from dynamiccl.api.nccl import Collective
from dynamiccl.api.rewards import BucketSummary, EventKind, JobRewardSummary, TunerEvent
from dynamiccl.api.tuning_run import TuningRunStatus
from dynamiccl.operator.learning.reward_status import reward_status


def bucket(nranks: int, calls: int, mean: float, default: float, bucket: int = 20) -> BucketSummary:
    return BucketSummary(
        collective=Collective.ALLREDUCE,
        size_bucket=bucket,
        nbytes_min=1 << bucket,
        nbytes_max=(2 << bucket) - 1,
        nranks=nranks,
        nnodes=1,
        calls=calls,
        mean_time_us=mean,
        nccl_default_time_us=default,
        speedup=default / mean,
        configurations_tried=2,
        explored_calls=5,
    )


def summary() -> JobRewardSummary:
    ev = TunerEvent(
        kind=EventKind.GUARDRAIL_REVERT,
        collective=Collective.ALLREDUCE,
        size_bucket=20,
        nbytes_min=1 << 20,
        nbytes_max=(2 << 20) - 1,
        call_index=77,
        regression=0.12,
    )
    done = ev.model_copy(update={"kind": EventKind.EXPLORATION_DONE})
    return JobRewardSummary(
        job_uid="j",
        batches=3,
        records=3,
        calls=300,
        speedup=None,
        buckets=(
            bucket(8, 100, 10.0, 20.0),
            bucket(16, 100, 30.0, 30.0),
            bucket(8, 100, 5.0, 5.0, 10),
        ),
        exploratory_calls=15,
        buckets_converged=1,
        guardrail_events=1,
        change_events=0,
        recent_events=(done, ev),
        last_received_unix_s=1.0,
    )


def test_scales_fold_into_one_bucket_in_seconds() -> None:
    st = reward_status(summary())
    assert [(b.size_bucket, b.calls) for b in st.reward.buckets] == [(10, 100), (20, 200)]
    b20 = st.reward.buckets[1]
    assert b20.measured_seconds == pytest.approx((100 * 10 + 100 * 30) / 1e6)
    assert b20.nccl_default_seconds == pytest.approx((100 * 20 + 100 * 30) / 1e6)
    assert st.reward.speedup == pytest.approx((2000 + 3000 + 500) / (1000 + 3000 + 500))
    assert (st.exploration.buckets_total, st.exploration.buckets_converged) == (2, 1)
    assert st.exploration.exploratory_calls == 15
    (g,) = st.guardrail_events
    assert (g.regression, g.size_bucket) == (0.12, 20)
    assert "call 77" in g.message


def test_patch_is_a_valid_tuningrun_status() -> None:
    patch = reward_status(summary()).patch()
    status = patch["status"]
    assert "guardrailEvents" in status
    assert "measuredSeconds" in status["reward"]
    parsed = TuningRunStatus.model_validate(status)
    assert parsed.reward.calls == 300


def test_empty_summary() -> None:
    empty = JobRewardSummary(
        job_uid="j",
        batches=0,
        records=0,
        calls=0,
        speedup=None,
        buckets=(),
        exploratory_calls=0,
        buckets_converged=0,
        guardrail_events=0,
        change_events=0,
        recent_events=(),
        last_received_unix_s=None,
    )
    st = reward_status(empty)
    assert (st.reward.calls, st.reward.speedup, st.reward.buckets) == (0, None, [])

"""New jobs get the learning loop's registry rollout unless the policy's spec pins a version."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.api.learning import LearningStatus, RolloutStatus
from dynamiccl.api.tuning_policy import ModelRollout
from dynamiccl.operator.controller.policy_match import choose_model

LEARNING = LearningStatus(rollout=RolloutStatus(promoted="p-1", canary="p-2", canary_percent=30))


def test_the_registry_rollout_reaches_jobs() -> None:
    got = [choose_model(ModelRollout(), f"uid-{i}", LEARNING) for i in range(1000)]
    canary = sum(1 for v, c in got if c)
    assert all(v == ("p-2" if c else "p-1") for v, c in got)
    assert 230 < canary < 370  # ~30 %
    assert choose_model(ModelRollout(), "uid-1", None) == ("default", False)


def test_pins_win() -> None:
    pinned = ModelRollout(version="v9")
    assert all(choose_model(pinned, f"u{i}", LEARNING) == ("v9", False) for i in range(50))
    both = ModelRollout(version="v9", canary_version="v10", canary_percent=100)
    assert choose_model(both, "u", LEARNING) == ("v10", True)


def _canary_set(uids: list[str], percent: int) -> set[str]:
    learning = LearningStatus(
        rollout=RolloutStatus(promoted="p-1", canary="p-2", canary_percent=percent)
    )
    return {u for u in uids if choose_model(ModelRollout(), u, learning)[1]}


@given(st.text(min_size=1, max_size=40))
def test_the_same_job_always_gets_the_same_answer(uid: str) -> None:
    """Operator restarts and webhook retries decide the same for a job (its uid alone)."""
    assert choose_model(ModelRollout(), uid, LEARNING) == choose_model(
        ModelRollout(), uid, LEARNING
    )


def test_the_canary_share_follows_canary_percent_and_grows_by_adding_jobs() -> None:
    """0, 10, 50, 100 % of 20 000 random uids get the canary; the jobs that got it at 10 %
    still get it at 20 % (raising the share only adds jobs)."""
    rng = random.Random(7)
    uids = [f"{rng.getrandbits(128):032x}" for _ in range(20_000)]
    for pct in (0, 10, 50, 100):
        assert len(_canary_set(uids, pct)) / len(uids) == pytest.approx(pct / 100, abs=0.015)
    assert _canary_set(uids, 10) <= _canary_set(uids, 20)

"""New jobs get the learning loop's registry rollout unless the policy's spec pins a version."""

from __future__ import annotations

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

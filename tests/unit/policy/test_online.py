"""The online tuner of one bucket: converges, detects change, reverts, stays deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.guardrail import GuardrailConfig
from dynamiccl.policy.online import BucketTuner, TunerConfig


def _drive(
    tuner: BucketTuner,
    means: np.ndarray,
    calls: int,
    rng: np.random.Generator,
    *,
    start: int = 0,
    rel_sd: float = 0.04,
) -> list[int]:
    arms = []
    for i in range(start, start + calls):
        a = tuner.arm_for_call(i)
        arms.append(a)
        tuner.observe(a, max(1e-3, float(rng.normal(means[a], rel_sd * means[a]))))
        if (i + 1) % tuner.cfg.epoch_calls == 0:
            tuner.end_epoch()
    return arms


def test_finds_the_fastest_arm_within_200_calls() -> None:
    rng = np.random.default_rng(0)
    regrets = []
    for trial in range(40):
        means = 100 * np.exp(rng.normal(0, 0.2, 8))
        t = BucketTuner(8, int(rng.integers(8)), TunerConfig(), seed=trial, comm_id=1, bucket=2)
        _drive(t, means, 200, rng)
        regrets.append(means[t.chosen()] / means.min() - 1)
    assert max(regrets) <= 0.03
    assert float(np.mean(regrets)) <= 0.005


def test_prior_weights_shape_the_first_epoch() -> None:
    t = BucketTuner(4, None, TunerConfig(prior_mix=0.0), 1, 1, 1, prior_weights=[0, 0, 1, 0])
    assert t.chosen() == 2
    assert {t.arm_for_call(i) for i in range(100)} == {2}


def test_weights_change_only_at_epoch_boundaries() -> None:
    rng = np.random.default_rng(3)
    means = np.array([100.0, 90.0, 120.0, 95.0])
    t = BucketTuner(4, 0, TunerConfig(epoch_calls=10), 5, 9, 4)
    seen = [t.weights]
    for i in range(100):
        a = t.arm_for_call(i)
        t.observe(a, float(rng.normal(means[a], 4)))
        assert t.weights == seen[-1]  # observe never changes the schedule
        if (i + 1) % 10 == 0:
            seen.append(t.end_epoch())
    assert len(set(seen)) > 1


def test_same_measurements_same_decisions() -> None:
    def run() -> tuple[list[int], tuple[int, ...], int]:
        rng = np.random.default_rng(11)
        t = BucketTuner(6, 0, TunerConfig(), 77, 1234, 9)
        arms = _drive(t, np.linspace(100, 150, 6), 160, rng)
        return arms, t.weights, t.chosen()

    assert run() == run()


def test_change_detection_reopens_exploration() -> None:
    rng = np.random.default_rng(4)
    means = np.array([100.0, 120.0, 130.0, 125.0])
    t = BucketTuner(4, 3, TunerConfig(), 1, 1, 1)
    _drive(t, means, 320, rng)
    assert t.chosen() == 0
    assert not any(e.kind == "change" for e in t.events)
    shifted = means.copy()
    shifted[0] = 160.0  # the committed arm slows down (congestion, a new neighbour...)
    _drive(t, shifted, 320, rng, start=320)
    assert any(e.kind == "change" for e in t.events)
    assert t.chosen() == 1


def test_guardrail_reverts_to_default_on_measurements() -> None:
    rng = np.random.default_rng(5)
    # Exploration is closed (static table) and the committed arm 1 turns 15 % slower
    # than the default 0 after the default was measured: revert.
    cfg = TunerConfig(prior_mix=0.0, explore_budget=0.0, guardrail=GuardrailConfig(threshold=0.05))
    t = BucketTuner(3, 0, cfg, 2, 2, 2, prior_weights=[0.0, 1.0, 0.0])
    for _ in range(10):
        t.observe(0, float(rng.normal(100, 4)))
    assert t.chosen() == 1
    _drive(t, np.array([100.0, 115.0, 130.0]), 64, rng)
    assert t.reverted
    assert t.chosen() == 0
    assert t.weights[0] == sum(t.weights)
    assert any(e.kind == "guardrail" and e.arm == 1 for e in t.events)
    assert t.banned[1]


def test_guardrail_uses_the_default_estimate_when_unmeasured() -> None:
    rng = np.random.default_rng(8)
    cfg = TunerConfig(prior_mix=0.0, explore_budget=0.0, guardrail=GuardrailConfig(threshold=0.05))
    slow = BucketTuner(3, 0, cfg, 2, 2, 2, prior_weights=[0, 1, 0], default_log_time=np.log(100))
    _drive(slow, np.array([100.0, 115.0, 130.0]), 64, rng)
    assert slow.reverted
    assert slow.chosen() == 0
    fine = BucketTuner(3, 0, cfg, 2, 2, 2, prior_weights=[0, 1, 0], default_log_time=np.log(100))
    _drive(fine, np.array([100.0, 90.0, 130.0]), 64, rng)
    assert not fine.reverted
    assert fine.chosen() == 1


def test_explore_budget_keeps_the_committed_arm_busy() -> None:
    rng = np.random.default_rng(6)
    t = BucketTuner(8, 0, TunerConfig(explore_budget=0.1), 1, 1, 1)
    on_committed = 0
    for i in range(640):
        a = t.arm_for_call(i)
        on_committed += a == t.chosen()
        t.observe(a, float(rng.normal(100.0 + a, 4.0)))
        if (i + 1) % t.cfg.epoch_calls == 0:
            t.end_epoch()
    assert on_committed / 640 > 0.85


def test_exploration_stops_after_budget_calls() -> None:
    rng = np.random.default_rng(7)
    t = BucketTuner(5, 0, TunerConfig(budget_calls=64), 1, 1, 1)
    _drive(t, np.array([100.0, 101.0, 102.0, 99.0, 100.5]), 96, rng)
    assert not t.exploring
    assert t.weights[t.chosen()] == sum(t.weights)


def test_from_policy_takes_threshold_and_budget() -> None:
    spec = NCCLTuningPolicySpec.model_validate(
        {
            "guardrails": {"regressionThreshold": 0.1, "minSamples": 7},
            "exploration": {"budgetCalls": 99},
        }
    )
    cfg = TunerConfig.from_policy(spec)
    assert cfg.guardrail.threshold == 0.1
    assert cfg.guardrail.min_samples == 7
    assert cfg.budget_calls == 99


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_arms": 0}, "n_arms"),
        ({"default_arm": 5}, "default_arm"),
        ({"prior_weights": [1.0]}, "prior_weights"),
    ],
)
def test_bad_construction(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {
        "n_arms": 3,
        "default_arm": 0,
        "cfg": TunerConfig(),
        "seed": 1,
        "comm_id": 1,
        "bucket": 1,
    }
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BucketTuner(**base)  # type: ignore[arg-type]


def test_bad_observation() -> None:
    t = BucketTuner(2, 0, TunerConfig(), 1, 1, 1)
    with pytest.raises(ValueError, match="time_us"):
        t.observe(0, float("nan"))
    with pytest.raises(ValueError, match="arm"):
        t.observe(2, 1.0)

"""The online tuner of one cell: converges, detects change, reverts, stays deterministic."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    Choice,
    DecisionTable,
    ExploreSchedule,
    decide,
    scale_class,
    size_bucket,
)
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.online.guardrail import GuardrailConfig
from dynamiccl.policy.online.tuner import (
    BucketTuner,
    CellKey,
    Plan,
    TunerConfig,
    plan_cell,
    plan_choice,
)


def _key(seed: int = 1, comm: int = 1, bucket: int = 20) -> CellKey:
    return CellKey(seed, comm, 16, 2, Collective.ALLREDUCE, bucket)


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
        t = BucketTuner(8, int(rng.integers(8)), TunerConfig(), _key(seed=trial))
        _drive(t, means, 200, rng)
        regrets.append(means[t.chosen()] / means.min() - 1)
    assert max(regrets) <= 0.03
    assert float(np.mean(regrets)) <= 0.005


# --- the schedule is the plugin's rule -------------------------------------
_CHOICES = [
    {"algo": Algo.RING, "proto": Proto.SIMPLE, "nchannels": 0},
    {"algo": Algo.RING, "proto": Proto.LL128, "nchannels": 8},
    {"algo": Algo.TREE, "proto": Proto.SIMPLE, "nchannels": 0},
    {"algo": Algo.TREE, "proto": Proto.LL, "nchannels": 4},
    {"algo": Algo.RING, "proto": Proto.LL, "nchannels": 2},
]


@pytest.mark.parametrize("explore", [0.0, 0.3, 1.0])
def test_arm_for_call_is_table_decide(explore: float) -> None:
    choices = [Choice(**c) for c in _CHOICES]
    key = CellKey(0xDEADBEEF, 0x1234, 16, 2, Collective.ALLREDUCE, size_bucket(1 << 20))
    plan = Plan(committed=2, candidates=((0, 100), (4, 7), (1, 65535), (3, 1)), explore=explore)
    scale = scale_class(16, 2)
    cell = plan_cell(plan, choices, key, scale=scale)
    table = DecisionTable(
        version=1, scales=(scale,), cells=(cell,), explore=ExploreSchedule(seed=key.seed)
    )
    for j in range(3000):
        want = decide(table, Collective.ALLREDUCE, 1 << 20, 16, 2, key.comm_id, j, lambda _: True)
        assert want is not None
        got = choices[plan_choice(plan, key, j)]
        assert Choice(**want.model_dump(include=set(Choice.model_fields))) == got


def test_schedule_is_identical_in_separate_processes() -> None:
    """Two 'ranks' (fresh interpreters) compute the same sequence of arms."""
    code = (
        "from dynamiccl.policy.online.tuner import Plan, CellKey, plan_choice;"
        "from dynamiccl.api.nccl import Collective;"
        "p = Plan(0, ((1, 500), (2, 300), (3, 200)), 0.6);"
        "k = CellKey(42, 0xABCDEF, 64, 8, Collective.ALLGATHER, 17);"
        "print(','.join(str(plan_choice(p, k, j)) for j in range(2000)))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(s)},
        ).stdout
        for s in (1, 2)
    }
    assert len(outs) == 1
    counts = Counter(outs.pop().strip().split(","))
    # explore 0.6 spread 5:3:2 -> 0.4 / 0.3 / 0.18 / 0.12
    assert abs(counts["0"] / 2000 - 0.4) < 0.05
    assert abs(counts["1"] / 2000 - 0.3) < 0.05


def test_plan_changes_only_at_epoch_boundaries() -> None:
    rng = np.random.default_rng(3)
    means = np.array([100.0, 90.0, 120.0, 95.0])
    t = BucketTuner(4, 0, TunerConfig(epoch_calls=10), _key(5, 9, 4))
    seen = [t.plan]
    for i in range(100):
        a = t.arm_for_call(i)
        t.observe(a, float(rng.normal(means[a], 4)))
        assert t.plan == seen[-1]  # observe never changes the schedule
        if (i + 1) % 10 == 0:
            seen.append(t.end_epoch())
    assert len(set(seen)) > 1
    assert all(len(p.candidates) <= 4 for p in seen)


def test_same_measurements_same_decisions() -> None:
    def run() -> tuple[list[int], Plan, int]:
        rng = np.random.default_rng(11)
        t = BucketTuner(6, 0, TunerConfig(), _key(77, 1234, 9))
        arms = _drive(t, np.linspace(100, 150, 6), 160, rng)
        return arms, t.plan, t.chosen()

    assert run() == run()


def test_change_detection_reopens_exploration() -> None:
    rng = np.random.default_rng(4)
    means = np.array([100.0, 120.0, 130.0, 125.0])
    t = BucketTuner(4, 3, TunerConfig(), _key())
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
    # Exploration is closed (static table) and the committed arm 1 is 15 % slower
    # than the default 0, which was measured before: revert.
    cfg = TunerConfig(explore_budget=0.0, guardrail=GuardrailConfig(threshold=0.05))
    t = BucketTuner(3, 0, cfg, _key(), prior_weights=[0.0, 1.0, 0.0])
    for _ in range(10):
        t.observe(0, float(rng.normal(100, 4)))
    assert t.chosen() == 1
    _drive(t, np.array([100.0, 115.0, 130.0]), 64, rng)
    assert t.reverted
    assert t.chosen() == 0
    assert not t.exploring
    assert any(e.kind == "guardrail" and e.arm == 1 for e in t.events)
    assert t.banned[1]


def test_guardrail_uses_the_default_estimate_when_unmeasured() -> None:
    rng = np.random.default_rng(8)
    cfg = TunerConfig(explore_budget=0.0, guardrail=GuardrailConfig(threshold=0.05))
    est = float(np.log(100))
    slow = BucketTuner(3, 0, cfg, _key(), prior_weights=[0, 1, 0], default_log_time=est)
    _drive(slow, np.array([100.0, 115.0, 130.0]), 64, rng)
    assert slow.reverted
    assert slow.chosen() == 0
    fine = BucketTuner(3, 0, cfg, _key(), prior_weights=[0, 1, 0], default_log_time=est)
    _drive(fine, np.array([100.0, 90.0, 130.0]), 64, rng)
    assert not fine.reverted
    assert fine.chosen() == 1


def test_explore_budget_keeps_the_committed_arm_busy() -> None:
    rng = np.random.default_rng(6)
    t = BucketTuner(8, 0, TunerConfig(explore_budget=0.1), _key())
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
    t = BucketTuner(5, 0, TunerConfig(budget_calls=64), _key())
    _drive(t, np.array([100.0, 101.0, 102.0, 99.0, 100.5]), 96, rng)
    assert not t.exploring
    assert {t.arm_for_call(j) for j in range(96, 400)} == {t.chosen()}


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
    base: dict[str, object] = {"n_arms": 3, "default_arm": 0, "cfg": TunerConfig(), "key": _key()}
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BucketTuner(**base)  # type: ignore[arg-type]


def test_bad_observation() -> None:
    t = BucketTuner(2, 0, TunerConfig(), _key())
    with pytest.raises(ValueError, match="time_us"):
        t.observe(0, float("nan"))
    with pytest.raises(ValueError, match="arm"):
        t.observe(2, 1.0)

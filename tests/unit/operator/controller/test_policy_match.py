"""Policy selection: selectors, kinds, explicit request, deterministic tie-break, canary."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.api.tuning_policy import JobKind, ModelRollout
from dynamiccl.operator.controller import policy_match as pm


def _obj(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 2}, "spec": spec}


def _select(objs: list[dict[str, Any]], **kw: Any) -> pm.Match:
    policies, errors = pm.parse_policies(objs)
    assert errors == []
    args: dict[str, Any] = {
        "kind": JobKind.PYTORCHJOB,
        "job_labels": {"team": "a"},
        "namespace_labels": {"env": "prod"},
    }
    return pm.select(policies, **(args | kw))


def test_no_policy_is_a_reason() -> None:
    m = _select([])
    assert m.policy is None
    assert "no NCCLTuningPolicy" in m.reason


def test_priority_then_specificity_then_name() -> None:
    objs = [
        _obj("b-wide"),
        _obj("a-wide"),
        _obj("narrow", selector={"jobSelector": {"matchLabels": {"team": "a"}}}),
    ]
    assert _select(objs).policy.name == "narrow"  # type: ignore[union-attr]
    assert _select(objs[:2]).policy.name == "a-wide"  # type: ignore[union-attr]
    objs.append(_obj("urgent", priority=10))
    m = _select(objs)
    assert m.policy is not None
    assert m.policy.name == "urgent"
    assert m.applicable == ("urgent", "narrow", "a-wide", "b-wide")
    assert "won over" in m.reason


def test_selectors_and_kinds_filter() -> None:
    objs = [
        _obj("mpi-only", selector={"jobKinds": ["MPIJob"]}),
        _obj("staging", selector={"namespaceSelector": {"matchLabels": {"env": "staging"}}}),
    ]
    assert _select(objs).policy is None
    assert _select(objs, kind=JobKind.MPIJOB).policy.name == "mpi-only"  # type: ignore[union-attr]


def test_requested_policy_must_exist_and_match() -> None:
    objs = [_obj("gold"), _obj("silver", selector={"jobKinds": ["MPIJob"]})]
    assert _select(objs, requested="gold").policy.name == "gold"  # type: ignore[union-attr]
    assert "does not exist" in _select(objs, requested="bronze").reason
    assert "does not select" in _select(objs, requested="silver").reason


def test_invalid_policies_are_skipped_with_a_message() -> None:
    policies, errors = pm.parse_policies(
        [_obj("ok"), _obj("bad", constraints={"channels": {"min": 9, "max": 1}})]
    )
    assert [p.name for p in policies] == ["ok"]
    assert errors[0].startswith("NCCLTuningPolicy bad: spec.constraints.channels")


@given(st.lists(st.sampled_from(["p1", "p2", "p3", "p4"]), min_size=1, unique=True), st.randoms())
def test_selection_does_not_depend_on_order(names: list[str], rnd: Any) -> None:
    objs = [_obj(n, priority=len(n) % 2) for n in names]
    shuffled = list(objs)
    rnd.shuffle(shuffled)
    assert _select(objs).policy == _select(shuffled).policy


def test_canary_is_stable_and_proportional() -> None:
    rollout = ModelRollout(version="v1", canary_version="v2", canary_percent=25)
    picks = [pm.choose_model(rollout, f"uid-{i}") for i in range(2000)]
    share = sum(canary for _, canary in picks) / len(picks)
    assert 0.2 < share < 0.3
    assert pm.choose_model(rollout, "uid-7") == pm.choose_model(rollout, "uid-7")
    assert pm.choose_model(ModelRollout(version="v1"), "x") == ("v1", False)

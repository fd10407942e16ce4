"""Label selectors and conditions behave as Kubernetes defines them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from dynamiccl.api.k8s import (
    Condition,
    ConditionStatus,
    LabelSelector,
    LabelSelectorRequirement,
    SelectorOperator,
    set_condition,
)


def test_empty_selector_matches_everything() -> None:
    assert LabelSelector().matches({})
    assert LabelSelector().matches({"a": "b"})


def test_match_labels_and_expressions() -> None:
    sel = LabelSelector.model_validate(
        {
            "matchLabels": {"team": "ml"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gold", "silver"]},
                {"key": "frozen", "operator": "DoesNotExist"},
            ],
        }
    )
    assert sel.matches({"team": "ml", "tier": "gold"})
    assert not sel.matches({"team": "ml", "tier": "bronze"})
    assert not sel.matches({"team": "ml", "tier": "gold", "frozen": "1"})
    assert not sel.matches({"tier": "gold"})
    assert sel.specificity == 3


def test_not_in_matches_absent_keys() -> None:
    req = LabelSelectorRequirement(key="x", operator=SelectorOperator.NOT_IN, values=["1"])
    sel = LabelSelector(match_expressions=[req])
    assert sel.matches({})
    assert not sel.matches({"x": "1"})


def test_exists_with_values_is_invalid() -> None:
    with pytest.raises(ValidationError, match="values must be"):
        LabelSelectorRequirement(key="x", operator=SelectorOperator.EXISTS, values=["1"])


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=5))
def test_selector_built_from_labels_matches_them(labels: dict[str, str]) -> None:
    assert LabelSelector(match_labels=labels).matches(labels)


def test_set_condition_keeps_transition_time_when_status_unchanged() -> None:
    first = Condition(
        type="Tuned", status=ConditionStatus.TRUE, reason="Ok", last_transition_time="t0"
    )
    again = Condition(
        type="Tuned", status=ConditionStatus.TRUE, reason="Ok2", last_transition_time="t1"
    )
    out = set_condition([first], again)
    assert len(out) == 1
    assert out[0].last_transition_time == "t0"
    assert out[0].reason == "Ok2"
    flipped = Condition(
        type="Tuned", status=ConditionStatus.FALSE, reason="No", last_transition_time="t2"
    )
    assert set_condition(out, flipped)[0].last_transition_time == "t2"
    other = Condition(type="X", status=ConditionStatus.FALSE, reason="No")
    assert [c.type for c in set_condition(out, other)] == ["Tuned", "X"]

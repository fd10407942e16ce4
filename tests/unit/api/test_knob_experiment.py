"""`status.envKnobs`: the shape the learning loop writes and the operator reads back."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dynamiccl.api.knob_experiment import ArmState, EnvKnobExperiment, KnobName

GOOD: dict[str, Any] = {
    "updated": "2026-11-23T18:00:00Z",
    "cohorts": [
        {
            "cohort": "c-1",
            "description": "H100 x8",
            "arms": [
                {
                    "knobs": [{"name": "NCCL_NTHREADS", "value": 512}],
                    "jobs": 7,
                    "state": "baseline",
                },
                {
                    "knobs": [{"name": "NCCL_NTHREADS", "value": 256}],
                    "jobs": 6,
                    "speedup": 1.1,
                    "low": 1.02,
                    "high": 1.2,
                    "state": "better",
                },
            ],
            "adopted": [{"name": "NCCL_NTHREADS", "value": 256}],
        }
    ],
}


def test_the_status_round_trips_and_finds_its_cohorts() -> None:
    exp = EnvKnobExperiment.model_validate(GOOD)
    entry = exp.cohort("c-1")
    assert entry is not None
    assert entry.arms[1].state is ArmState.BETTER
    assert entry.adopted is not None
    assert entry.adopted[0].name is KnobName.NCCL_NTHREADS
    assert exp.cohort("c-2") is None
    dumped = exp.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert EnvKnobExperiment.model_validate(dumped) == exp


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("cohorts", 0, "arms", 0, "knobs", 0, "name"), "NCCL_ALGO", "name"),
        (("cohorts", 0, "arms", 1, "speedup"), 0.0, "speedup"),
        (("cohorts", 0, "arms", 1, "state"), "great", "state"),
        (("cohorts", 0, "arms", 0, "jobs"), -1, "jobs"),
        (("cohorts", 0, "cohort"), "", "cohort"),
        (("cohorts", 0, "surprise"), 1, "surprise"),
    ],
)
def test_bad_input_names_the_field(path: tuple[Any, ...], value: Any, field: str) -> None:
    bad = copy.deepcopy(GOOD)
    cur: Any = bad
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    with pytest.raises(ValidationError) as exc:
        EnvKnobExperiment.model_validate(bad)
    assert field in str(exc.value)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(["updated", "cohorts", "x"]), _json))
def test_garbage_is_a_validation_error_never_a_crash(raw: dict[str, Any]) -> None:
    errors: list[Any] = []
    try:
        exp = EnvKnobExperiment.model_validate(raw)
    except ValidationError as exc:
        errors = list(exc.errors())
    if errors:
        assert all(e["loc"] for e in errors)  # every complaint names where
        return
    assert EnvKnobExperiment.model_validate(exp.model_dump(mode="json", by_alias=True)) == exp

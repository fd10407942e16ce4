"""RFC 6902 diff/apply: applying diff(a, b) to a gives b, also for real pod mutations."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.operator import jsonpatch, mutate

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(st.sampled_from(["a", "b", "c/d", "e~f"]), kids, max_size=4)
    ),
    max_leaves=20,
)


@given(_JSON, _JSON)
def test_diff_then_apply_round_trips(a: Any, b: Any) -> None:
    assert jsonpatch.apply(a, jsonpatch.diff(a, b)) == b


def test_keys_with_slashes_are_escaped() -> None:
    ops = jsonpatch.diff({"m": {}}, {"m": {"dynamiccl.io/injected": "1"}})
    assert ops == [{"op": "add", "path": "/m/dynamiccl.io~1injected", "value": "1"}]


def test_appended_and_prepended_lists_are_incremental() -> None:
    assert jsonpatch.diff({"l": [1]}, {"l": [1, 2]}) == [{"op": "add", "path": "/l/-", "value": 2}]
    assert jsonpatch.diff({"l": [1]}, {"l": [0, 1]}) == [{"op": "add", "path": "/l/0", "value": 0}]


def test_pod_mutation_as_a_patch() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "t", "image": "i"}]}}
    inj = mutate.Injection(job_name="j", job_kind="PyTorchJob", config_map="j-dynamiccl", image="x")
    mutated = mutate.mutate_pod(pod, inj)
    ops = jsonpatch.diff(pod, mutated)
    assert jsonpatch.apply(pod, ops) == mutated
    assert jsonpatch.diff(mutated, mutate.mutate_pod(mutated, inj)) == []

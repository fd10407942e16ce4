"""Our RFC 6902 diff, applied by the `jsonpatch` library: diff(a, b) applied to a gives b."""

from __future__ import annotations

from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.operator.webhook import mutate, patch

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
    assert jsonpatch.apply_patch(a, patch.diff(a, b)) == b


def test_keys_with_slashes_are_escaped() -> None:
    ops = patch.diff({"m": {}}, {"m": {"dynamiccl.io/injected": "1"}})
    assert ops == [{"op": "add", "path": "/m/dynamiccl.io~1injected", "value": "1"}]


def test_appended_and_prepended_lists_are_incremental() -> None:
    assert patch.diff({"l": [1]}, {"l": [1, 2]}) == [{"op": "add", "path": "/l/-", "value": 2}]
    assert patch.diff({"l": [1]}, {"l": [0, 1]}) == [{"op": "add", "path": "/l/0", "value": 0}]


def test_pod_mutation_as_a_patch() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "t", "image": "i"}]}}
    inj = mutate.Injection(job_name="j", job_kind="PyTorchJob", config_map="j-dynamiccl", image="x")
    mutated = mutate.mutate_pod(pod, inj)
    ops = patch.diff(pod, mutated)
    assert jsonpatch.apply_patch(pod, ops) == mutated
    assert patch.diff(mutated, mutate.mutate_pod(mutated, inj)) == []

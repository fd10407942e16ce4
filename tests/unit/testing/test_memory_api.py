"""dynamiccl.testing.memory_api behaves as the API server does where the tests rely on it:
copies on read and write, a taken name refused, JSON merge patches (null deletes), the
status subresource apart from the rest of the object, a stale resourceVersion refused (409)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.operator.kube import ConflictError, NotFoundError, Resource
from dynamiccl.testing.memory_api import Clock, MemoryAPI, merge_patch

POLICIES = Resource("dynamiccl.io", "v1alpha1", "nccltuningpolicies", namespaced=False)
RUNS = Resource("dynamiccl.io", "v1alpha1", "tuningruns")


def _run(name: str, labels: dict[str, str] | None = None) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ml", "labels": labels or {}}, "spec": {}}


def test_reads_and_writes_copy() -> None:
    api = MemoryAPI()
    body = _run("a")
    got = api.create(RUNS, body)
    body["spec"] = {"x": 1}
    got["spec"] = {"x": 2}
    api.list(RUNS)[0]["spec"]["y"] = 3
    assert api.get(RUNS, "a", "ml")["spec"] == {}


def test_create_gives_a_uid_and_a_time_and_refuses_a_taken_name() -> None:
    api = MemoryAPI(Clock(start=0.0))
    made = api.create(RUNS, _run("a"))
    assert made["metadata"]["uid"]
    assert made["metadata"]["creationTimestamp"] == "1970-01-01T00:00:00Z"
    assert (
        api.create(RUNS, {"metadata": {"name": "b", "namespace": "ml", "uid": "u-b"}})["metadata"][
            "uid"
        ]
        == "u-b"
    )
    with pytest.raises(ConflictError):
        api.create(RUNS, _run("a"))


def test_list_selects_by_namespace_and_labels() -> None:
    api = MemoryAPI()
    api.create(RUNS, _run("a", {"team": "x"}))
    api.create(RUNS, _run("b", {"team": "y"}))
    assert [o["metadata"]["name"] for o in api.list(RUNS, "ml", "team=y")] == ["b"]
    assert api.list(RUNS, "other") == []


def test_status_patch_touches_the_status_alone_and_null_deletes() -> None:
    api = MemoryAPI()
    api.add(POLICIES, {"metadata": {"name": "p"}, "spec": {"a": 1}, "status": {"s": {"x": 1}}})
    out = api.patch(
        POLICIES, "p", {"spec": {"a": 2}, "status": {"s": {"y": 2, "x": None}}}, status=True
    )
    assert out["spec"] == {"a": 1}
    assert out["status"] == {"s": {"y": 2}}
    out = api.patch(POLICIES, "p", {"spec": {"b": [1, None]}, "status": {"s": {}}})
    assert out["spec"] == {"a": 1, "b": [1, None]}  # lists replace, as they are
    assert out["status"] == {"s": {"y": 2}}
    assert api.patches_of(POLICIES) == ["p", "p"]
    with pytest.raises(NotFoundError):
        api.patch(POLICIES, "q", {"status": {}}, status=True)


def test_a_write_with_a_stale_resource_version_is_refused_and_changes_nothing() -> None:
    """Two writers read the same version: the first write wins, the second gets 409 and
    the object keeps the first writer's spec (what leader election relies on)."""
    api = MemoryAPI()
    api.add(POLICIES, {"metadata": {"name": "fixture"}, "spec": {}})
    made = api.create(RUNS, _run("a"))
    seen = made["metadata"]["resourceVersion"]
    assert seen != api.get(POLICIES, "fixture")["metadata"]["resourceVersion"]
    first = api.patch(RUNS, "a", {"metadata": {"resourceVersion": seen}, "spec": {"w": 1}}, "ml")
    assert first["metadata"]["resourceVersion"] != seen
    for status in (False, True):
        with pytest.raises(ConflictError):
            api.patch(
                RUNS,
                "a",
                {"metadata": {"resourceVersion": seen}, "spec": {"w": 2}, "status": {"w": 2}},
                "ml",
                status=status,
            )
    assert api.get(RUNS, "a", "ml") == first
    assert api.patches_of(RUNS) == ["a"]
    # a write that names no version is not a conditional one
    assert api.patch(RUNS, "a", {"spec": {"w": 3}}, "ml")["spec"] == {"w": 3}


_json = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=8,
)


@given(_json, st.dictionaries(st.text(max_size=2), _json))
def test_merge_patch_is_idempotent_and_a_null_deletes(
    target: object, patch: dict[str, object]
) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once  # RFC 7386 patches are idempotent
    assert all(k not in once for k, v in patch.items() if v is None)
    assert all(once[k] == v for k, v in patch.items() if not isinstance(v, dict | type(None)))


def test_delete_of_a_missing_object_is_no_error_and_events_are_kept_as_copies() -> None:
    api = MemoryAPI()
    api.create(RUNS, _run("a"))
    api.delete(RUNS, "a", "ml")
    with pytest.raises(NotFoundError):
        api.get(RUNS, "a", "ml")
    api.delete(RUNS, "a", "ml")  # gone already: as the operator's adapter, no error
    ev = {"reason": "NCCLTuned", "involvedObject": {"name": "j"}}
    api.event(ev)
    ev["reason"] = "edited later"
    assert [e["reason"] for e in api.events] == ["NCCLTuned"]

"""Which releases and cluster-scoped objects `real_node_sessions.remove_leftovers` takes for
a dead session's: only the chart's `dynamiccl` release, in a namespace a session made or one
that is gone; never another release of the chart, nor one in a namespace no session made."""

from __future__ import annotations

from typing import Any

from dynamiccl.testing.real_node_sessions import (
    HELM_NAMESPACE_ANNOTATION,
    RELEASE,
    SESSION_PREFIXES,
    dead_release_namespaces,
    orphans,
)
from dynamiccl.testing.real_release import SYSTEM_NS

SESSION = {"dcl-real-1a2b3c"}
EXISTING = {"dcl-real-1a2b3c", "team-a", "dynamiccl-demo-system", "kube-system"}


def test_only_the_real_node_release_of_a_session_namespace_or_a_gone_one_is_dead() -> None:
    releases = [
        {"name": RELEASE, "namespace": "dcl-real-1a2b3c"},  # a session's: dead
        {"name": RELEASE, "namespace": "dcl-real-gone"},  # its namespace is gone: dead
        {"name": RELEASE, "namespace": "team-a"},  # a user's install under the same name
        {"name": "dynamiccl-demo", "namespace": "dynamiccl-demo-system"},  # another release
        {"name": "dynamiccl-demo", "namespace": "dcl-real-1a2b3c"},
    ]
    assert dead_release_namespaces(releases, SESSION, EXISTING) == [
        "dcl-real-1a2b3c",
        "dcl-real-gone",
    ]


def _object(name: str, owner: str | None) -> dict[str, Any]:
    annotations = {} if owner is None else {HELM_NAMESPACE_ANNOTATION: owner}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_cluster_objects_are_orphans_only_where_their_release_namespace_is_dead() -> None:
    objects = [
        _object("dynamiccl-operator", "dcl-real-gone"),  # its namespace went with the record
        _object("dynamiccl-webhook", "dcl-real-1a2b3c"),
        _object("dynamiccl-ingest", "team-a"),  # a live release's
        _object("dynamiccl-node-agent", None),  # not helm's: not ours to judge
    ]
    assert orphans(objects, SESSION, EXISTING) == ["dynamiccl-operator", "dynamiccl-webhook"]


def test_the_demos_release_namespace_is_named_as_a_session_namespace() -> None:
    """The real-node demo's namespaces from before the label are found by their name."""
    assert SYSTEM_NS.startswith(SESSION_PREFIXES)

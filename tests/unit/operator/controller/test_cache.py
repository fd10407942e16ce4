"""The watch-fed cache: events, resync dropping stale keys, waiting."""

from __future__ import annotations

import threading

from dynamiccl.operator.controller.cache import (
    ObjectCache,
    shrink_config_map,
    shrink_node,
    shrink_node_topology,
)


def _obj(ns: str, name: str, v: int = 0) -> dict[str, object]:
    return {"metadata": {"namespace": ns, "name": name}, "data": {"env.json": str(v), "x": "y"}}


def test_events_and_resync() -> None:
    cache = ObjectCache(shrink_config_map)
    cache.on_event("SYNC", _obj("a", "1"))
    cache.on_event("SYNC", _obj("a", "2"))
    cache.on_event("RESYNCED", {})
    assert cache.synced.is_set()
    got = cache.get("a", "1")
    assert got is not None
    assert got["data"] == {"env.json": "0"}
    cache.on_event("MODIFIED", _obj("a", "1", 5))
    got = cache.get("a", "1")
    assert got is not None
    assert got["data"]["env.json"] == "5"
    cache.on_event("DELETED", _obj("a", "2"))
    assert cache.get("a", "2") is None
    cache.on_event("SYNC", _obj("a", "3"))
    cache.on_event("RESYNCED", {})
    assert len(cache) == 1  # "1" was not in the new listing: dropped


def test_wait_for_sees_a_later_add() -> None:
    cache = ObjectCache()
    timer = threading.Timer(0.05, cache.on_event, args=("ADDED", _obj("n", "late")))
    timer.start()
    assert cache.wait_for("n", "late", timeout=5) is not None
    assert cache.wait_for("n", "never", timeout=0.01) is None


def test_shrink_node_keeps_labels_and_gpus() -> None:
    node = {
        "metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {"big": "x" * 100}},
        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "4"}, "images": [1, 2]},
    }
    small = shrink_node(node)
    assert small["status"]["capacity"] == {"nvidia.com/gpu": "8"}
    assert "annotations" not in small["metadata"]


def test_version_counts_every_change() -> None:
    cache = ObjectCache()
    v0 = cache.version
    cache.on_event("ADDED", {"metadata": {"name": "a"}})
    cache.on_event("MODIFIED", {"metadata": {"name": "a"}})
    cache.on_event("DELETED", {"metadata": {"name": "a"}})
    assert cache.version == v0 + 3


def test_a_node_topologys_spec_node_name_never_reaches_the_operator() -> None:
    """Issue 32: a node agent set its NodeTopology's spec.nodeName to another node's name.
    The chart's node-agent policy refuses that now; and the operator never read it: it
    keys topologies by object name (the agent's own node, by that policy) and keeps only
    the status."""
    cache = ObjectCache(shrink_node_topology)
    cache.on_event(
        "ADDED",
        {"metadata": {"name": "node-a"}, "spec": {"nodeName": "node-b"}, "status": {"spec": 1}},
    )
    assert cache.get("", "node-b") is None
    assert cache.get("", "node-a") == {"metadata": {"name": "node-a"}, "status": {"spec": 1}}

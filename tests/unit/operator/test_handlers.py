"""The handlers' pure parts (the rest runs against the real apiserver in integration/e2e)."""

from __future__ import annotations

from typing import Any

from dynamiccl.operator.handlers import BoundPods


def _pod(uid: str, node: str | None, phase: str | None) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_each_binding_refines_once_even_if_first_seen_running() -> None:
    b = BoundPods()
    assert not b.first_binding("ADDED", _pod("a", None, "Pending"))  # not bound yet
    # kopf squashed bind + Running into one event: still the first binding.
    assert b.first_binding("MODIFIED", _pod("a", "n1", "Running"))
    assert not b.first_binding("MODIFIED", _pod("a", "n1", "Running"))
    assert b.first_binding("MODIFIED", _pod("b", "n2", "Pending"))
    assert not b.first_binding("DELETED", _pod("a", "n1", "Running"))
    assert "a" not in b.seen
    assert not b.first_binding("MODIFIED", _pod("", "n1", None))  # no uid: ignored


def test_initial_listing_only_refines_pods_still_pending() -> None:
    b = BoundPods()
    assert not b.first_binding(None, _pod("r", "n1", "Running"))  # the job's own event covers it
    assert not b.first_binding("MODIFIED", _pod("r", "n1", "Running"))  # remembered
    assert b.first_binding(None, _pod("p", "n1", "Pending"))

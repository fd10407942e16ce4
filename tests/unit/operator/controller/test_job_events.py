"""Which job and pod events call for a reconcile (operator/controller/job_events.py)."""

from __future__ import annotations

from typing import Any

from dynamiccl.operator.controller.job_events import AppliedJobs, BoundPods, job_fingerprint


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


def _job(**meta: Any) -> dict[str, Any]:
    base = {"uid": "u1", "generation": 1, "annotations": {"dynamiccl.io/tune": "true"}}
    return {"metadata": base | meta, "status": {"conditions": [{"type": "Running"}]}}


def test_status_only_job_updates_are_recognised_as_unchanged() -> None:
    applied = AppliedJobs()
    fp = job_fingerprint(_job(), policies_version=7)
    assert not applied.unchanged("u1", fp)  # never reconciled
    applied.remember("u1", fp)
    status_update = _job() | {"status": {"conditions": [{"type": "Succeeded"}]}}
    assert applied.unchanged("u1", job_fingerprint(status_update, 7))
    for changed in (
        job_fingerprint(_job(generation=2), 7),  # spec edited
        job_fingerprint(_job(annotations={"dynamiccl.io/tune": "false"}), 7),
        job_fingerprint(_job(labels={"team": "a"}), 7),
        job_fingerprint(_job(), 8),  # a policy changed
    ):
        assert not applied.unchanged("u1", changed)
    applied.forget("u1")
    assert not applied.unchanged("u1", fp)
    assert not applied.unchanged("", job_fingerprint(_job(uid=""), 7))  # no uid: always run


# --- Reconciler.apply over a recording fake of our own Kube wrapper --------------------

"""Which job and pod events call for a reconcile (pure: the handlers ask, kopf's events answer).

A job's event is skipped when nothing the decision reads changed since the job was
last reconciled (`job_fingerprint`, remembered per uid in `AppliedJobs`): the
training operator rewriting the job's status every few seconds costs nothing. A
pod's event refines its job once, at the pod's first binding to a node
(`BoundPods`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dynamiccl.operator.controller import configmap


def job_fingerprint(job: Mapping[str, Any], policies_version: int) -> str:
    """What a job's decision depends on besides its pods: spec generation, annotations,
    labels, and the policies (their cache's version)."""
    meta = job.get("metadata") or {}
    return configmap.digest(
        [
            meta.get("generation"),
            meta.get("annotations") or {},
            meta.get("labels") or {},
            policies_version,
        ]
    )


@dataclass
class AppliedJobs:
    """The fingerprint each job was last reconciled with (bounded by the live jobs)."""

    last: dict[str, str] = field(default_factory=dict)

    def unchanged(self, uid: str, fingerprint: str) -> bool:
        return bool(uid) and self.last.get(uid) == fingerprint

    def remember(self, uid: str, fingerprint: str) -> None:
        if uid:
            self.last[uid] = fingerprint

    def forget(self, uid: str) -> None:
        self.last.pop(uid, None)


@dataclass
class BoundPods:
    """Which training pods were already seen on a node: each binding refines its job once.

    The phase alone cannot tell a fresh binding: kopf squashes the events of one
    object that arrive within its batch window, and a fake (or fast) kubelet
    reports ``Running`` right after the scheduler binds the pod, so the first
    event we see of a bound pod may already say ``Running``.
    """

    seen: set[str] = field(default_factory=set)

    def first_binding(self, event_type: str | None, pod: Mapping[str, Any]) -> bool:
        """True once per pod uid, on the first event showing it bound to a node.

        ``event_type`` None is kopf's initial listing: those pods are only
        remembered (the jobs' own initial events reconcile them already bound).
        """
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if event_type == "DELETED":
            self.seen.discard(uid)
            return False
        if not uid or uid in self.seen or not (pod.get("spec") or {}).get("nodeName"):
            return False
        self.seen.add(uid)
        phase = (pod.get("status") or {}).get("phase")
        return event_type is not None or phase in (None, "Pending")

"""Faults on the real node: what a user's cluster does to DynamICCL's pods.

- The ingest pod starts before its serving certificate exists (every fresh
  install: the operator creates the Secret after the chart's objects): it must
  wait for it and start once, never exit and restart.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.real.conftest import RELEASE, RealCluster, Release, diagnose, wait_until

pytestmark = [pytest.mark.real]

TLS_SECRET = f"{RELEASE}-webhook-tls"


def _scale(real_cluster: RealCluster, ns: str, name: str, replicas: int) -> None:
    real_cluster.apps().patch_namespaced_deployment_scale(
        name, ns, {"spec": {"replicas": replicas}}
    )


def _pods(real_cluster: RealCluster, ns: str, component: str) -> list[Any]:
    core: Any = real_cluster.core()
    sel = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
    return [
        p
        for p in core.list_namespaced_pod(ns, label_selector=sel).items
        if not p.metadata.deletion_timestamp
    ]


def _ready(pod: Any) -> bool:
    return any(s.ready for s in pod.status.container_statuses or [])


def _restarts(pod: Any) -> int:
    return sum(s.restart_count for s in pod.status.container_statuses or [])


def test_ingest_waits_for_its_certificate_and_starts_once(
    real_cluster: RealCluster, release: Release
) -> None:
    """The ingest pod created while its TLS Secret does not exist starts once it does.

    Reproduces a fresh install deterministically: the operator (which issues the
    certificate) is stopped, the Secret deleted and the ingest pod recreated. The
    kubelet must hold the container (the Secret volume is required) instead of
    starting an ingest that exits on the missing tls.crt (restart count 1 on
    every install before the fix).
    """
    core: Any = real_cluster.core()
    ns = release.namespace
    _scale(real_cluster, ns, release.operator(), 0)
    try:
        wait_until("the operator pod gone", lambda: not _pods(real_cluster, ns, "operator"), 120)
        core.delete_namespaced_secret(TLS_SECRET, ns)
        for p in _pods(real_cluster, ns, "ingest"):
            core.delete_namespaced_pod(p.metadata.name, ns)
        wait_until("a new ingest pod", lambda: len(_pods(real_cluster, ns, "ingest")) == 1, 120)
        time.sleep(15)  # long enough for an ingest without its certificate to exit
        (waiting,) = _pods(real_cluster, ns, "ingest")
        assert not _ready(waiting), "the ingest is Ready without a certificate"
        assert _restarts(waiting) == 0, diagnose(real_cluster, ns)
    finally:
        _scale(real_cluster, ns, release.operator(), 1)
    start = time.monotonic()

    def ingest_ready() -> bool:
        pods = _pods(real_cluster, ns, "ingest")
        return len(pods) == 1 and _ready(pods[0])

    try:
        wait_until("the ingest Ready once the operator issued its certificate", ingest_ready, 180)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{diagnose(real_cluster, ns)}")
    took = time.monotonic() - start
    (pod,) = _pods(real_cluster, ns, "ingest")
    print(
        f"\ningest Ready {took:.1f} s after the operator started again; restarts {_restarts(pod)}"
    )
    assert (
        pod.metadata.name == waiting.metadata.name
    )  # the same pod: it waited, nothing replaced it
    assert _restarts(pod) == 0, diagnose(real_cluster, ns)
    wait_until(
        "the operator Ready again",
        lambda: any(_ready(p) for p in _pods(real_cluster, ns, "operator")),
        180,
    )

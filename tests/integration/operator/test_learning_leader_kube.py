"""The learning loop's Lease on a real API server (operator/learning/leader.py, Kube adapter).

Three candidates step against the same `coordination.k8s.io/v1` Lease with the API
server's own optimistic concurrency (resourceVersion, 409): at no sample do two of them
lead; when the holder stops renewing another takes over after the Lease's duration; a
released Lease is taken at once. Needs the local control plane (`make integration`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynamiccl.operator.kube import NAMESPACES, Kube
from dynamiccl.operator.learning.leader import LEASES, LeaderElector

DURATION_S = 3.0


@pytest.fixture
def kube_ns(cluster_kubeconfig: Path) -> Iterator[tuple[Kube, str]]:
    kube = Kube(str(cluster_kubeconfig))
    ns = f"lease-{uuid.uuid4().hex[:8]}"
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield kube, ns
    with contextlib.suppress(Exception):
        kube.delete(NAMESPACES, ns)


def _run(es: dict[str, LeaderElector], stop: dict[str, threading.Event]) -> list[threading.Thread]:
    def loop(name: str) -> None:
        e = es[name]
        while not stop[name].is_set():
            with contextlib.suppress(Exception):  # an API hiccup: `held` runs out on its own
                e.step()
            stop[name].wait(e.retry_s)

    threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in es]
    for t in threads:
        t.start()
    return threads


def _leaders(es: dict[str, LeaderElector]) -> list[str]:
    return [n for n, e in es.items() if e.held]


def test_one_leader_takeover_and_release_on_the_apiserver(kube_ns: tuple[Kube, str]) -> None:
    kube, ns = kube_ns
    es = {n: LeaderElector(kube, ns, "learning", n, duration_s=DURATION_S) for n in "abc"}
    stop = {n: threading.Event() for n in es}
    threads = _run(es, stop)
    try:
        deadline = time.monotonic() + 4 * DURATION_S
        first: list[str] = []
        while time.monotonic() < deadline:
            now = _leaders(es)
            assert len(now) <= 1, now
            first = first or now
            time.sleep(0.05)
        assert first, "nobody took the Lease"
        (holder,) = _leaders(es) or first
        lease = kube.get(LEASES, "learning", ns)
        assert lease["spec"]["holderIdentity"] == holder
        stop[holder].set()  # the holder stalls: no renewals, no release
        t0 = time.monotonic()
        while not [n for n in _leaders(es) if n != holder]:
            assert len(_leaders(es)) <= 1
            assert time.monotonic() - t0 < 3 * DURATION_S, "no takeover"
            time.sleep(0.05)
        took_s = time.monotonic() - t0
        assert took_s >= DURATION_S * 2 / 3  # not before the old holder's own deadline
        (second,) = _leaders(es)
        stop[second].set()
        time.sleep(es[second].retry_s * 2)
        es[second].release()  # a clean stop hands over at once
        t1 = time.monotonic()
        while not [n for n in _leaders(es) if n not in (holder, second)]:
            assert time.monotonic() - t1 < DURATION_S, "a released Lease was not taken at once"
            time.sleep(0.05)
    finally:
        for ev in stop.values():
            ev.set()
        for t in threads:
            t.join(5)

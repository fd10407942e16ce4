"""Webhook scaled to zero, or hanging: pods are still created (untuned) in normal time.

Training is never blocked by DynamICCL (docs/architecture.md, 'Invariants'). The chart registers
the webhook with ``failurePolicy: Ignore`` and ``timeoutSeconds`` <= 3. Here the
local operator process is the webhook's only replica (see conftest.py), so
stopping it is "scaled to zero" (connection refused); a TCP listener on its
port that accepts and never answers (no TLS handshake, no response) is a hung
webhook. Pods of an annotated job must appear no later than an unannotated
job's pods would (measured in the same test), plus at most one webhook timeout
per pod when the webhook hangs — and they must be untuned.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from dynamiccl import constants as c
from dynamiccl.testing.waiting import wait_for
from tests.e2e.operator.jobs import PT, assert_untouched, create, pods_of, pytorchjob, running_pods
from tests.e2e.operator.release import Release


class BlackHole:
    """Accepts TCP connections on the webhook's port and never answers (not even TLS)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.accepted: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


def _time_to_pods(release: Release, ns: str, name: str, annotations: dict[str, str]) -> float:
    start = time.monotonic()
    create(release, ns, PT, pytorchjob(name, annotations, gpus=1))
    wait_for(f"2 pods of {name}", lambda: len(pods_of(release, ns, name)) == 2, 60, every=0.1)
    return time.monotonic() - start


@pytest.fixture
def operator_stopped(release: Release) -> Iterator[None]:
    release.stop()
    try:
        yield
    finally:
        release.start()


@pytest.mark.usefixtures("operator_stopped")
def test_webhook_down_or_hanging_pods_start_untuned_in_normal_time(
    release: Release, tuned_namespace: str
) -> None:
    ns = tuned_namespace
    adm = k8s.AdmissionregistrationV1Api(release.api)
    hooks = adm.read_mutating_webhook_configuration(release.webhook_config).webhooks
    assert hooks
    timeout = 0
    for h in hooks:
        assert h.timeout_seconds is not None  # the apiserver defaults it
        timeout = max(timeout, h.timeout_seconds)
    baseline = _time_to_pods(release, ns, "baseline", {})  # not selected by any webhook call

    # Scaled to zero: nothing listens on the webhook's address (connection refused).
    down = _time_to_pods(release, ns, "down", {c.ANNOTATION_TUNE: "true"})
    assert down <= baseline + 10.0, (down, baseline)

    # Hanging: the connection is accepted, no TLS handshake, no answer.
    hole = BlackHole(release.port)
    try:
        slow = _time_to_pods(release, ns, "slow", {c.ANNOTATION_TUNE: "true"})
        assert hole.accepted, "the apiserver never called the hanging webhook"
    finally:
        hole.close()
    print(f"pods created: baseline {baseline:.2f}s, down {down:.2f}s, hanging {slow:.2f}s")
    # Each pod CREATE waits at most timeoutSeconds, then failurePolicy Ignore admits it.
    assert slow >= timeout, slow
    assert slow <= baseline + 2 * (timeout + 1) + 10.0, (slow, baseline, timeout)
    for job in ("down", "slow"):
        for pod in running_pods(release, ns, job, 2):
            assert_untouched(pod)

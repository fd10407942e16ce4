"""Faults on the real node: what a user's cluster does to DynamICCL's pods.

- The ingest pod starts before its serving certificate exists (every fresh
  install: the operator creates the Secret after the chart's objects): it must
  wait for it and start once, never exit and restart.
- Mid-job, the operator pod is killed and the ingest pod deleted: the job keeps
  its tables and finishes, a new operator takes over, rewards arrive exactly once.
- The webhook down (no endpoint) or hanging: new pods start untuned, within the
  webhook's timeout.

The tuned job is the one of test_training_real.py (tests/real/training.py, with
its stand-ins: GPU node labels on a node without GPU, a response surface for
call times).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from dynamiccl.testing.real_manifests import ON_REAL_NODE
from tests.real import training as t
from tests.real.conftest import (
    RELEASE,
    RealCluster,
    Release,
    _cache_dir,
    diagnose,
    wait_until,
)

pytestmark = [pytest.mark.real]

TLS_SECRET = f"{RELEASE}-webhook-tls"
FAULT_STEPS = 4000  # 80 s of training: both faults hit within its first 30 s


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


def _kill_and_wait_for_new(real_cluster: RealCluster, ns: str, component: str) -> float:
    """Delete the component's one pod at once (grace 0); seconds until a new pod is Ready."""
    core: Any = real_cluster.core()
    (old,) = _pods(real_cluster, ns, component)
    core.delete_namespaced_pod(old.metadata.name, ns, grace_period_seconds=0)
    killed = time.monotonic()

    def replaced() -> bool:
        ps = _pods(real_cluster, ns, component)
        return any(p.metadata.name != old.metadata.name and _ready(p) for p in ps)

    wait_until(f"a new {component} pod Ready", replaced, 180)
    return time.monotonic() - killed


def _webhook_gone(real_cluster: RealCluster, ns: str) -> bool:
    """No operator pod is left, not even a terminating one (it still serves the
    webhook during its grace period: a run saw the 'refused' pod injected), and the
    webhook Service's Endpoints name no address."""
    core: Any = real_cluster.core()
    sel = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
    if core.list_namespaced_pod(ns, label_selector=sel).items:
        return False
    ep = core.read_namespaced_endpoints(f"{RELEASE}-webhook", ns)
    return not any(sub.addresses for sub in ep.subsets or [])


def _webhook_endpoint_is(real_cluster: RealCluster, ns: str, pod: str) -> bool:
    """The webhook Service's Endpoints name exactly `pod` (ready)."""
    core: Any = real_cluster.core()
    ep = core.read_namespaced_endpoints(f"{RELEASE}-webhook", ns)
    names = {
        (a.target_ref.name if a.target_ref else None)
        for sub in ep.subsets or []
        for a in sub.addresses or []
    }
    return names == {pod}


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


# ------------------------------------------------------------------ faults during a tuned job
@pytest.fixture(scope="module")
def tuned(real_cluster: RealCluster, release: Release) -> Iterator[Release]:
    """The chart installed, the node labelled as a GPU node, a learned-mode policy."""
    t.tuning_policy(real_cluster)
    with t.gpu_node_labels(real_cluster, t.GPU_PRODUCTS["faults"]):
        yield release
    t.delete_policy(real_cluster)


def _suspended_job(real_cluster: RealCluster, ns: str, name: str) -> dict[str, Any]:
    """An annotated job the training operator creates no pods for (runPolicy.suspend)."""
    image = f"{real_cluster.image_repository}:{real_cluster.image_tag}"
    body = t.pytorchjob(name, image, t.NONROOT_POD, t.HARDENED_CONTAINER)
    body["spec"]["runPolicy"] = {"suspend": True}
    return t.create_job(real_cluster, ns, body)


def _sidecar_retries(real_cluster: RealCluster, ns: str, pod: str) -> int:
    core: Any = real_cluster.core()
    log = core.read_namespaced_pod_log(pod, ns, container="dynamiccl-sidecar")
    return sum("ingest:" in line and "retrying" in line for line in log.splitlines())


def test_tuned_job_survives_operator_and_ingest_loss(
    real_cluster: RealCluster, tuned: Release
) -> None:
    """Mid-job, the operator pod is killed, then the ingest pod deleted.

    The job keeps its tables (both pods end on the same committed epochs) and
    finishes; a new operator pod takes over (a job created after the kill gets its
    TuningRun and ConfigMap from it); the sidecars spool their rewards while the
    ingest is away and deliver them after it returns, each exactly once: the store
    holds, per pod, exactly the records the sidecar had acknowledged, and as many
    rows as its stored batches declared (a resent batch is answered as a duplicate
    and not stored again).
    """
    release = tuned
    core: Any = real_cluster.core()
    ns = t.job_namespace(real_cluster, f"dcl-faults-{uuid.uuid4().hex[:4]}", "restricted")
    rel_ns = release.namespace
    try:
        s = t.start_job(real_cluster, ns, "bert", t.Harness(steps=FAULT_STEPS))
        t.wait_committed(real_cluster, s)
        before = {
            p.metadata.name: t.progress(real_cluster, ns, p.metadata.name)
            for p in t.pods(real_cluster, ns, s.name)
        }

        operator_back_s = _kill_and_wait_for_new(real_cluster, rel_ns, "operator")
        _suspended_job(real_cluster, ns, "probe")
        wait_until(
            "the new operator's TuningRun for a job created after the kill",
            lambda: t.tuning_run(real_cluster, ns, "probe") is not None,
            120,
        )
        core.read_namespaced_config_map("probe-dynamiccl", ns)

        ingest_back_s = _kill_and_wait_for_new(real_cluster, rel_ns, "ingest")
        pods = t.wait_done(real_cluster, ns, s.name, 600)
        running = {p.metadata.name: t.progress(real_cluster, ns, p.metadata.name) for p in pods}

        summaries = t.ranks(real_cluster, ns, pods)
        # the epochs that took effect (an epoch committed after the last call may be mirrored
        # into one pod's file and not yet the other's: it never ran)
        epochs = {rank: t.took_effect(h["epochs"], h["calls"]) for rank, h in summaries.items()}
        assert len({json.dumps(e) for e in epochs.values()}) == 1, epochs
        assert all(e and "epoch" in e[0] for e in epochs.values()), epochs
        assert all(h["calls"] == FAULT_STEPS * 7 for h in summaries.values()), summaries

        sidecars = {
            p.metadata.name: t.sidecar_stopped(real_cluster, ns, p.metadata.name) for p in pods
        }
        retries = {
            p.metadata.name: _sidecar_retries(real_cluster, ns, p.metadata.name) for p in pods
        }
        rows = t.store_rows(release, s.job["metadata"]["uid"])
        acked = {p.metadata.uid: sidecars[p.metadata.name]["acknowledged_records"] for p in pods}
        assert rows == acked, (rows, acked, sidecars)
        for side in sidecars.values():
            assert side["outbox_batches"] == 0, side
        assert any(retries.values()), f"no sidecar saw the ingest gone: {retries}"
        results = {
            "operator_back_s": round(operator_back_s, 1),
            "ingest_back_s": round(ingest_back_s, 1),
            "progress_at_kill": before,
            "progress_at_end": running,
            "epochs": next(iter(epochs.values())),
            "store_rows": rows,
            "acknowledged_records": acked,
            "sidecar_send_retries": retries,
            "speedup": t.speedup(real_cluster, release, s, 120),
        }
        (_cache_dir() / "logs" / "real-tier-faults.json").write_text(json.dumps(results, indent=1))
        print(f"\nfaults: {json.dumps(results)}")
    finally:
        t.delete_namespace(real_cluster, ns)


# ------------------------------------------------------------------ the webhook down
BLACKHOLE = (
    "import socket, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('', 8443)); s.listen(64); held = []\n"
    "while True: held.append(s.accept())  # accept, never answer\n"
)


def _bare_pod(real_cluster: RealCluster, name: str, job: str, **extra: Any) -> dict[str, Any]:
    """A pod the webhook would mutate (a Kubeflow job's label; the job has a ConfigMap)."""
    image = f"{real_cluster.image_repository}:{real_cluster.image_tag}"
    labels = {"training.kubeflow.org/job-name": job, **extra.pop("labels", {})}
    container = {
        "name": "pytorch",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["python", "-c", extra.pop("script", "print('ran')")],
        "securityContext": t.HARDENED_CONTAINER,
        **extra,
    }
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            **ON_REAL_NODE,
            "restartPolicy": "Never",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, **t.NONROOT_POD},
            "containers": [container],
        },
    }


def _create_timed(real_cluster: RealCluster, ns: str, pod: dict[str, Any]) -> tuple[float, Any]:
    core: Any = real_cluster.core()
    start = time.monotonic()
    created = core.create_namespaced_pod(ns, pod)
    return time.monotonic() - start, created


def _injected(pod: Any) -> bool:
    return any(c.name == "dynamiccl-sidecar" for c in pod.spec.init_containers or [])


def _started_s(real_cluster: RealCluster, ns: str, name: str) -> float:
    core: Any = real_cluster.core()

    def started() -> bool:
        phase = core.read_namespaced_pod(name, ns).status.phase
        return bool(phase in ("Running", "Succeeded"))

    return wait_until(f"pod {ns}/{name} started", started, 120, interval=0.2)


def test_webhook_down_new_pods_start_untuned_within_its_timeout(
    real_cluster: RealCluster, tuned: Release
) -> None:
    """The webhook (failurePolicy Ignore, timeoutSeconds 3) refused or hanging: pods start.

    A tuned job's ConfigMap exists, so the webhook would inject its pods. With the
    operator up a new pod is injected (the control); with the operator scaled to 0
    (the Service has no endpoint: connections refused) and with a Service endpoint
    that accepts connections and never answers, the apiserver creates the pod
    untouched within the webhook's timeout and the pod starts, untuned. Measured:
    the create call's latency and the time until the pod runs.
    """
    release = tuned
    core: Any = real_cluster.core()
    rel_ns = release.namespace
    timeout_s = 3  # chart default webhook.timeoutSeconds
    ns = t.job_namespace(real_cluster, f"dcl-webhook-{uuid.uuid4().hex[:4]}", "restricted")
    hole = "webhook-blackhole"
    measured: dict[str, dict[str, Any]] = {}
    try:
        _suspended_job(real_cluster, ns, "probe")
        wait_until(
            "the job's ConfigMap",
            lambda: bool(
                core.list_namespaced_config_map(
                    ns, field_selector="metadata.name=probe-dynamiccl"
                ).items
            ),
            120,
        )
        for case in ("up", "refused", "hanging"):
            if case == "refused":
                _scale(real_cluster, rel_ns, release.operator(), 0)
                wait_until(
                    "no operator pod, terminating ones included, and no webhook endpoint",
                    lambda: _webhook_gone(real_cluster, rel_ns),
                    120,
                )
            if case == "hanging":
                svc_labels = {
                    "app.kubernetes.io/name": "dynamiccl",
                    "app.kubernetes.io/instance": RELEASE,
                    "app.kubernetes.io/component": "operator",
                }
                body = _bare_pod(
                    real_cluster,
                    hole,
                    "none",
                    script=BLACKHOLE,
                    ports=[{"name": "webhook", "containerPort": 8443}],
                )
                body["metadata"]["labels"] = svc_labels  # the webhook Service selects it
                core.create_namespaced_pod(rel_ns, body)
                wait_until(
                    "the black hole behind the webhook Service (its Endpoints list it)",
                    lambda: _webhook_endpoint_is(real_cluster, rel_ns, hole),
                    120,
                )
            latency, _ = _create_timed(
                real_cluster, ns, _bare_pod(real_cluster, f"p-{case}", "probe")
            )
            start_s = _started_s(real_cluster, ns, f"p-{case}")
            pod = core.read_namespaced_pod(f"p-{case}", ns)
            measured[case] = {
                "create_s": round(latency, 2),
                "create_to_running_s": round(latency + start_s, 2),
                "injected": _injected(pod),
            }
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(hole, rel_ns, grace_period_seconds=0)
        _scale(real_cluster, rel_ns, release.operator(), 1)
        t.delete_namespace(real_cluster, ns)
    (_cache_dir() / "logs" / "real-tier-webhook-down.json").write_text(json.dumps(measured))
    print(f"\nwebhook down: {json.dumps(measured)}")
    assert measured["up"]["injected"], measured
    for case in ("refused", "hanging"):
        assert not measured[case]["injected"], measured
    # the hang was met and cut off by the webhook's timeout: the create waited for it, and no
    # longer than it plus the apiserver's own time for a create under the same load (the
    # refused case: the same create without waiting)
    hang = measured["hanging"]["create_s"]
    assert timeout_s - 0.5 <= hang < timeout_s + 1.5 + measured["refused"]["create_s"], measured
    wait_until(
        "the operator Ready again",
        lambda: any(_ready(p) for p in _pods(real_cluster, rel_ns, "operator")),
        180,
    )

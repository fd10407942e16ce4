"""Tuned training jobs on the real node: what the real-tier tests create and read back.

A PyTorchJob annotated ``dynamiccl.io/tune: "true"`` goes through the real
Kubeflow training operator; the chart's webhook injects the plugin install step
and the sidecar into its pods; the main container (the runtime image) runs
``dynamiccl/testing/harness_pod.py``, which plays NCCL against the injected plugin
(the jobs' objects are ``dynamiccl/testing/real_manifests.py``'s, shared with the
real-node demo).

Stand-ins, said where they matter:
- the real node has no GPU: ``gpu_node_labels`` gives it the labels GPU Feature
  Discovery and topograph put on an 8-GPU NVSwitch node, so the operator
  describes (and the prior tunes for) such a node;
- call times come from a response surface (``harness_pod.py``), built here from
  the job's own TuningRun features once the operator observed its pods.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.testing.real_manifests import (
    DEPARTURE,
    HARDENED_CONTAINER,
    NODE_NAME,
    NONROOT_POD,
    PODS,
    RANKS_PER_POD,
    STEP,
    Harness,
    gpu_labels,
    harness_data,
    pytorchjob,
    times_data,
)
from dynamiccl.testing.real_node_sessions import SESSION_LABELS
from tests.real.conftest import (
    RealCluster,
    Release,
    namespace_body,
    wait_until,
)

# the jobs' objects (dynamiccl/testing/real_manifests.py), for the tier's tests: t.Harness, ...
__all__ = [
    "DEPARTURE",
    "HARDENED_CONTAINER",
    "NONROOT_POD",
    "PODS",
    "RANKS_PER_POD",
    "STEP",
    "Harness",
    "gpu_labels",
    "pytorchjob",
]
POLICY = "real-training"
NS_LABEL = "dynamiccl-real"  # namespaces of the real tier's tuned jobs
# GPU Feature Discovery's and topograph's labels of an 8-GPU NVSwitch node (a stand-in: this
# node has no GPU; the node agent's NodeTopology says so and the operator then reads labels).
# Each tuned job of the tier gets its own GPU model, so its own hardware class: a class whose
# cells earlier jobs settled explores nothing there (policy/runtime/exploration.py; what they
# found reaches new jobs through retraining, test_learning_real.py), and every job here must
# find the departure itself.
GPU_PRODUCTS = {
    "nonroot": "NVIDIA-H100-80GB-HBM3",
    "root-nocaps": "NVIDIA-H200",
    "faults": "NVIDIA-H800",
}


@contextlib.contextmanager
def gpu_node_labels(real_cluster: RealCluster, product: str) -> Iterator[None]:
    """The real node labelled as an 8-GPU NVSwitch node of `product` while the block runs."""
    core: Any = real_cluster.core()
    labels = gpu_labels(product)
    core.patch_node(NODE_NAME, {"metadata": {"labels": labels}})
    try:
        yield
    finally:
        core.patch_node(NODE_NAME, {"metadata": {"labels": dict.fromkeys(labels)}})


def tuning_policy(real_cluster: RealCluster) -> None:
    """A learned-mode NCCLTuningPolicy for the namespaces labelled NS_LABEL (idempotent)."""
    body = {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": POLICY, "labels": dict(SESSION_LABELS)},
        "spec": {
            "mode": "learned",
            "priority": 100,
            "selector": {
                "namespaceSelector": {"matchLabels": {NS_LABEL: "training"}},
                "jobKinds": ["PyTorchJob"],
            },
            # a one-minute job: 5 % of its collective time (default 1 %), so that the budget
            # does not end exploration before the race measured the cell's arms
            "exploration": {"seed": 7, "budgetPercent": 5},
            "model": {"version": "default"},
        },
    }
    custom: Any = real_cluster.custom()
    try:
        custom.create_cluster_custom_object("dynamiccl.io", "v1alpha1", "nccltuningpolicies", body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def delete_policy(real_cluster: RealCluster) -> None:
    custom: Any = real_cluster.custom()
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(
            "dynamiccl.io", "v1alpha1", "nccltuningpolicies", POLICY
        )


def job_namespace(real_cluster: RealCluster, name: str, level: str) -> str:
    """A namespace enforcing Pod Security `level`, selected by the real tier's policy."""
    core: Any = real_cluster.core()
    core.create_namespace(namespace_body(name, level, {NS_LABEL: "training"}))
    return name


def harness_config_map(real_cluster: RealCluster, ns: str, job: str, h: Harness) -> None:
    core: Any = real_cluster.core()
    data = harness_data(h)
    core.create_namespaced_config_map(ns, {"metadata": {"name": f"{job}-harness"}, "data": data})


def times_config_map(real_cluster: RealCluster, ns: str, job: str, features: StateFeatures) -> str:
    """The response surface of the job's topology (from its TuningRun's features)."""
    name, data = times_data(features)
    core: Any = real_cluster.core()
    core.create_namespaced_config_map(ns, {"metadata": {"name": f"{job}-times"}, "data": data})
    return name


def create_job(real_cluster: RealCluster, ns: str, job: dict[str, Any]) -> dict[str, Any]:
    custom: Any = real_cluster.custom()
    out: dict[str, Any] = custom.create_namespaced_custom_object(
        "kubeflow.org", "v1", ns, "pytorchjobs", job
    )
    return out


def tuning_run(real_cluster: RealCluster, ns: str, job: str) -> dict[str, Any] | None:
    custom: Any = real_cluster.custom()
    try:
        out: dict[str, Any] = custom.get_namespaced_custom_object(
            "dynamiccl.io", "v1alpha1", ns, "tuningruns", f"{job}-dynamiccl"
        )
    except ApiException:
        return None
    return out


def observed_features(real_cluster: RealCluster, ns: str, job: str) -> StateFeatures:
    """The job's features once the operator saw its pods bound (spec.features.scheduled)."""
    got: list[StateFeatures] = []

    def scheduled() -> bool:
        tr = tuning_run(real_cluster, ns, job)
        feats = ((tr or {}).get("spec") or {}).get("features")
        if feats and feats.get("scheduled"):
            got.append(StateFeatures.model_validate(feats))
            return True
        return False

    wait_until(f"TuningRun {ns}/{job}-dynamiccl with the pods' observed features", scheduled, 120)
    return got[-1]


def pods(real_cluster: RealCluster, ns: str, job: str) -> list[Any]:
    core: Any = real_cluster.core()
    sel = f"training.kubeflow.org/job-name={job}"
    return sorted(
        core.list_namespaced_pod(ns, label_selector=sel).items, key=lambda p: p.metadata.name
    )


def wait_done(real_cluster: RealCluster, ns: str, job: str, timeout: float) -> list[Any]:
    """Wait until every pod of the job terminated; they must have Succeeded."""

    def done() -> bool:
        ps = pods(real_cluster, ns, job)
        return len(ps) == PODS and all(p.status.phase in ("Succeeded", "Failed") for p in ps)

    wait_until(f"the pods of {ns}/{job} finished", done, timeout, interval=2)
    ps = pods(real_cluster, ns, job)
    assert all(p.status.phase == "Succeeded" for p in ps), [
        (p.metadata.name, p.status.phase, p.status.container_statuses) for p in ps
    ]
    return ps


def json_lines(
    real_cluster: RealCluster, ns: str, pod: str, container: str
) -> list[dict[str, Any]]:
    core: Any = real_cluster.core()
    text = core.read_namespaced_pod_log(pod, ns, container=container)
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def harness_summaries(real_cluster: RealCluster, ns: str, pod: str) -> list[dict[str, Any]]:
    """Every rank process's summary line (one per local rank)."""
    lines = [x["summary"] for x in json_lines(real_cluster, ns, pod, "pytorch") if "summary" in x]
    assert len(lines) == RANKS_PER_POD, f"{pod}: {len(lines)} rank summaries"
    return sorted(lines, key=lambda x: int(x["rank"]))


def ranks(real_cluster: RealCluster, ns: str, pods: list[Any]) -> dict[int, dict[str, Any]]:
    """Rank -> its summary, over all pods."""
    return {
        int(h["rank"]): h
        for p in pods
        for h in harness_summaries(real_cluster, ns, p.metadata.name)
    }


def sidecar_stopped(real_cluster: RealCluster, ns: str, pod: str) -> dict[str, Any]:
    """The sidecar's last word (its log line when it stops): what it sent and had acknowledged."""
    core: Any = real_cluster.core()
    log = core.read_namespaced_pod_log(pod, ns, container="dynamiccl-sidecar")
    marker = "sidecar stopped: "
    lines = [ln.split(marker, 1)[1] for ln in log.splitlines() if marker in ln]
    assert lines, f"{pod}: the sidecar logged no summary when it stopped:\n{log[-2000:]}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def took_effect(epochs: list[dict[str, Any]], calls: int) -> list[dict[str, Any]]:
    """The committed epochs a rank ran: boundary (a call index) below the calls it made."""
    return [e for e in epochs if "boundary" not in e or int(e["boundary"]) < calls]


def delete_namespace(real_cluster: RealCluster, ns: str) -> None:
    """Delete a test namespace (kept with DYNAMICCL_REAL_KEEP=1, to look into a failure)."""
    if os.environ.get("DYNAMICCL_REAL_KEEP") == "1":
        print(f"kept namespace {ns} (DYNAMICCL_REAL_KEEP=1)")
        return
    core: Any = real_cluster.core()
    core.delete_namespace(ns)


def store_rows(release: Release, job_uid: str) -> dict[str, int]:
    """Per pod uid: experience rows and the records its stored batches declared."""
    db = sqlite3.connect(f"file:{release.store_db()}?mode=ro", uri=True)
    try:
        rows = dict(
            db.execute(
                "SELECT pod_uid, COUNT(*) FROM experience WHERE job_uid = ? GROUP BY pod_uid",
                (job_uid,),
            ).fetchall()
        )
        declared = dict(
            db.execute(
                "SELECT pod_uid, SUM(n_records) FROM batches WHERE job_uid = ? GROUP BY pod_uid",
                (job_uid,),
            ).fetchall()
        )
    finally:
        db.close()
    assert rows == declared, f"experience rows {rows} != records of stored batches {declared}"
    return {str(k): int(v) for k, v in rows.items()}


def stored_calls(release: Release, job_uid: str) -> int:
    """The calls the store holds for the job (the sum of its experience rows' counts)."""
    db = sqlite3.connect(f"file:{release.store_db()}?mode=ro", uri=True)
    try:
        row = db.execute(
            "SELECT COALESCE(SUM(count), 0) FROM experience WHERE job_uid = ?", (job_uid,)
        ).fetchone()
    finally:
        db.close()
    return int(row[0])


def speedup(real_cluster: RealCluster, release: Release, s: Started, timeout: float) -> float:
    """The TuningRun's status.reward.speedup once the learning loop summarised every call the
    store holds for the job (read after the sidecars stopped: the store is final). The loop
    syncs a job's status on its own interval while batches land, so the first figure it
    writes can cover only the job's first part (exploration before the tuner's tables)."""
    want = stored_calls(release, s.job["metadata"]["uid"])
    got: list[tuple[int, float | None]] = []

    def written() -> bool:
        tr = tuning_run(real_cluster, s.namespace, s.name) or {}
        reward = (tr.get("status") or {}).get("reward") or {}
        got.append((int(reward.get("calls") or 0), reward.get("speedup")))
        return got[-1][0] == want and got[-1][1] is not None

    wait_until(
        f"status.reward of {s.namespace}/{s.name}-dynamiccl over all {want} stored calls "
        f"(last seen: {got[-1] if got else None})",
        written,
        timeout,
        interval=2,
    )
    return float(got[-1][1] or 0.0)


def tuned_effect(by_epoch: list[dict[str, Any]]) -> dict[str, float]:
    """What the tables the sidecars' tuners proposed did, from one rank's `by_epoch` (the
    harness: per table in effect, each key's calls and the response surface's mean time of
    what ran and of NCCL's own choice for the same calls). The job's first epoch is its
    initial table (the operator's); every later one is a tuner's.

    `tuned_share`: the share of calls under the tuners' tables; `tuned_speedup`: NCCL's own
    choice's time over what ran, for those calls; `job_speedup` the same over the whole job."""

    def ratio(parts: list[dict[str, Any]]) -> float:
        own = sum(k["nccl_us"] for x in parts for k in x["keys"].values())
        ran = sum(k["ran_us"] for x in parts for k in x["keys"].values())
        return own / ran if ran > 0 else 0.0

    tuned = [x for x in by_epoch if x["epoch"] > 0][1:]
    calls = sum(x["calls"] for x in by_epoch)
    return {
        "tuned_share": sum(x["calls"] for x in tuned) / calls if calls else 0.0,
        "tuned_speedup": ratio(tuned),
        "job_speedup": ratio(by_epoch),
    }


def ingest_url(pod: Any) -> str:
    sidecar = next(ct for ct in pod.spec.init_containers if ct.name == "dynamiccl-sidecar")
    return str(next(e.value for e in sidecar.env if e.name == c.ENV_INGEST_URL))


def is_service_dns(url: str, release: Release) -> bool:
    """https://<service>.<namespace>.svc:<port>/...: a name only the cluster's DNS resolves."""
    pattern = rf"https://{re.escape(release.ingest())}\.{re.escape(release.namespace)}\.svc[:/]"
    return re.match(pattern, url) is not None


def now() -> float:
    return time.time()


@dataclass(frozen=True)
class Started:
    """A job created, its pods bound and given their response surface."""

    namespace: str
    name: str
    job: dict[str, Any]
    created_t: float
    topology: str


def start_job(  # noqa: PLR0917 - the job's coordinates
    real_cluster: RealCluster,
    ns: str,
    name: str,
    harness: Harness,
    pod_security: dict[str, Any] | None = None,
    container_security: dict[str, Any] | None = None,
) -> Started:
    """ConfigMaps, the PyTorchJob, then (pods bound) the surface of the observed topology."""
    image = f"{real_cluster.image_repository}:{real_cluster.image_tag}"
    harness_config_map(real_cluster, ns, name, harness)
    created = now()
    job = create_job(
        real_cluster,
        ns,
        pytorchjob(
            name,
            image,
            NONROOT_POD if pod_security is None else pod_security,
            HARDENED_CONTAINER if container_security is None else container_security,
        ),
    )
    features = observed_features(real_cluster, ns, name)
    topology = times_config_map(real_cluster, ns, name, features)
    return Started(ns, name, job, created, topology)


def progress(real_cluster: RealCluster, ns: str, pod: str) -> dict[str, Any]:
    """The harness's last progress line ({} before the first)."""
    try:
        lines = json_lines(real_cluster, ns, pod, "pytorch")
    except ApiException:
        return {}
    got = [x["progress"] for x in lines if "progress" in x]
    return got[-1] if got else {}


def wait_committed(real_cluster: RealCluster, s: Started, timeout: float = 240) -> None:
    """Until every pod's plugin runs a committed table (its progress line says so)."""

    def committed() -> bool:
        ps = pods(real_cluster, s.namespace, s.name)
        return len(ps) == PODS and all(
            progress(real_cluster, s.namespace, p.metadata.name).get("committed", 0) > 0 for p in ps
        )

    wait_until(f"a committed table in every pod of {s.name}", committed, timeout, interval=2)

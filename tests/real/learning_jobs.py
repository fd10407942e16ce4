"""The cluster side of the learning check (tests/real/test_learning_real.py).

Policy and job manifests, the jobs as the operator tuned them, the retraining
Job and its pod, the policy's rollout status, the ingest's log. What is played
and posted, and how cells are compared, is in learning_support.py.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.harness_job import JobSpec, play_job
from dynamiccl.demo.sequence import STEP
from dynamiccl.operator.controller import configmap
from dynamiccl.operator.learning.retrain import POLICY_LABEL
from dynamiccl.policy.runtime.compile import compile_table
from dynamiccl.policy.runtime.encode import job_spec
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from dynamiccl.testing import builders
from dynamiccl.testing.real_node_sessions import SESSION_LABELS
from dynamiccl.testing.surface import Departure, Surface
from dynamiccl.testing.workload import Op, build_time_table
from tests.real.conftest import RELEASE, RealCluster, Release, wait_until
from tests.real.learning_support import Recorder, ServiceClient, bound_token, ingest_service

POLICY: Final = "0-real-learning"  # top priority, and the name sorts first among equals
NS_LABEL: Final = "dynamiccl-real-learning"
NTP: Final = ("dynamiccl.io", "v1alpha1", "nccltuningpolicies")
TR: Final = ("dynamiccl.io", "v1alpha1", "tuningruns")
PT: Final = ("kubeflow.org", "v1", "pytorchjobs")
# the 4 kwok A100 nodes: no NVLink SHARP, so the tables explore Tree and Ring for large
# all-reduce, where the surface's departure is (the kwok H100 nodes have NVLS: their tables
# explore NVLS Tree there, which the departure leaves as the simulator has it)
A100: Final = {c.NODE_LABEL_GFD_PRODUCT: "NVIDIA-A100-SXM4-80GB"}
CALLS: Final = 50_000  # a job's calls (the whole training step of dynamiccl/demo/sequence.py)


def policy_body(job_ns: str, min_new: int) -> dict[str, Any]:
    """The learned policy of the check: its jobs' namespace, every new job a canary."""
    return {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": POLICY, "labels": dict(SESSION_LABELS)},
        "spec": {
            "mode": "learned",
            "priority": 1000,  # the highest the CRD allows (ties: the name sorts first)
            "selector": {"namespaceSelector": {"matchLabels": {NS_LABEL: job_ns}}},
            "exploration": {"budgetPercent": 1.0},
            "retraining": {"minNewExperience": min_new, "canaryPercent": 100},
        },
    }


def pytorchjob(name: str) -> dict[str, Any]:
    # builders.IMAGE: kwok nodes start no container
    ct = builders.container(command=["torchrun", "/workspace/train.py"])
    return builders.pytorchjob(
        name,
        annotations={c.ANNOTATION_TUNE: "true"},
        workers=3,
        pod=builders.template(ct, node_selector=A100),
        nproc_per_node="8",
        restart_policy="OnFailure",
    )


@dataclass
class TunedJob:
    """A job as the operator tuned it: TuningRun, features, table."""

    name: str
    uid: str
    run: dict[str, Any]
    features: StateFeatures
    table: DecisionTable
    config: dict[str, str]  # the ConfigMap's data: what the job's sidecar reads


def tuned_job(real_cluster: RealCluster, ns: str, name: str) -> TunedJob:
    custom: Any = real_cluster.custom()
    core: Any = real_cluster.core()
    job = custom.create_namespaced_custom_object(*PT[:2], ns, PT[2], pytorchjob(name))
    obj = configmap.object_name(name)

    def scheduled() -> dict[str, Any] | None:
        with contextlib.suppress(ApiException):
            run: dict[str, Any] = custom.get_namespaced_custom_object(*TR[:2], ns, TR[2], obj)
            if run["spec"].get("features", {}).get("scheduled"):
                return run
        return None

    wait_until(
        f"the TuningRun of {name} refined from its pods' nodes", lambda: bool(scheduled()), 180
    )
    run = scheduled()
    assert run is not None

    def compiled_for_scheduled() -> bool:
        data = core.read_namespaced_config_map(obj, ns).data
        scheduled = json.loads(data[configmap.KEY_FEATURES]).get("scheduled")
        return bool(scheduled) and "format" not in json.loads(data[configmap.KEY_TABLE])

    try:  # the operator retries a model it could not fetch yet (configmap.model_unavailable)
        wait_until(f"{name}'s table compiled for its pods' nodes", compiled_for_scheduled, 120)
    except pytest.fail.Exception as exc:
        table = core.read_namespaced_config_map(obj, ns).data[configmap.KEY_TABLE]
        pytest.fail(f"{exc}: the ConfigMap holds NCCL's empty table: {table}")
    cm = core.read_namespaced_config_map(obj, ns)
    features = StateFeatures.model_validate_json(cm.data[configmap.KEY_FEATURES])
    table = DecisionTable.model_validate_json(cm.data[configmap.KEY_TABLE])
    return TunedJob(name, job["metadata"]["uid"], run, features, table, dict(cm.data))


def play(real_cluster: RealCluster, rel: Release, ns: str, job: TunedJob, work: Path) -> Recorder:
    """Job 1's calls through the plugin; its rewards to the ingest Service, as its sidecar."""
    core: Any = real_cluster.core()
    pods = core.list_namespaced_pod(ns, label_selector=f"{c.LABEL_KUBEFLOW_JOB_NAME}={job.name}")
    master = next(p for p in pods.items if p.metadata.name.endswith("-master-0"))
    work.mkdir(parents=True, exist_ok=True)
    token = work / "token"
    token.write_text(bound_token(core, ns, master))
    ingest = ingest_service(core, rel.namespace, RELEASE, work / "ingest-ca.crt")
    recorder = Recorder(ServiceClient(ingest, token))
    ops = tuple(Op(coll, n, 1, "") for coll, n in dict.fromkeys(STEP))
    # the job's own topology (what the operator saw of its nodes), with the departure
    surface = Surface(build_time_table(job_spec(job.features), ops), Departure(), 1)
    spec = JobSpec(
        namespace=ns, name=job.name, uid=job.uid, pod_name=master.metadata.name,
        pod_uid=master.metadata.uid, model_version=job.run["spec"]["modelVersion"],
        features=job.features, step=[(coll.nccl_id, n) for coll, n in STEP], calls=CALLS,
    )  # fmt: skip
    (work / "features.json").write_text(job.features.model_dump_json(indent=1))
    (work / "table.json").write_text(job.table.model_dump_json(indent=1))
    try:
        played = play_job(spec, job.config, surface, work / "job", recorder)
    except RuntimeError as exc:
        pytest.fail(f"posting the rewards of {job.name}: {exc}; answers: {recorder.answers[-3:]}")
    finally:
        recorder.client.close()
    (work / "played.json").write_text(json.dumps(played.budget, indent=1))
    return recorder


def finish(real_cluster: RealCluster, ns: str, job: TunedJob) -> None:
    """Wait until the loop synced the job's rewards into its TuningRun (which also stores
    the job's features for the retrain), then delete the job (its pods hold the A100 nodes)."""
    custom: Any = real_cluster.custom()
    obj = configmap.object_name(job.name)

    def synced() -> bool:  # the operator writes an empty reward summary; the loop the calls
        run = custom.get_namespaced_custom_object(*TR[:2], ns, TR[2], obj)
        return int(((run.get("status") or {}).get("reward") or {}).get("calls") or 0) > 0

    wait_until(f"the rewards of {job.name} in its TuningRun's status", synced, 120)
    custom.delete_namespaced_custom_object(*PT[:2], ns, PT[2], job.name)


def retrain_job(real_cluster: RealCluster, rel: Release) -> dict[str, Any] | None:
    """The policy's finished retraining Job (as JSON), if any."""
    batch: Any = k8s.BatchV1Api(real_cluster.api)
    jobs = batch.list_namespaced_job(rel.namespace, label_selector=f"{POLICY_LABEL}={POLICY}")
    done = [j for j in jobs.items if j.status and (j.status.succeeded or j.status.failed)]
    if not done:
        return None
    api: Any = real_cluster.api
    out: dict[str, Any] = api.sanitize_for_serialization(done[-1])
    return out


def finished_pod(real_cluster: RealCluster, rel: Release, job_name: str) -> Any:
    core: Any = real_cluster.core()
    pods = core.list_namespaced_pod(rel.namespace, label_selector=f"job-name={job_name}").items
    assert pods, f"no pod of the retraining Job {job_name}"
    return pods[-1]


def canary(real_cluster: RealCluster) -> str | None:
    """The canary version the policy's status gives a share of the jobs."""
    custom: Any = real_cluster.custom()
    policy = custom.get_cluster_custom_object(*NTP[:2], NTP[2], POLICY)
    rollout = ((policy.get("status") or {}).get("learning") or {}).get("rollout") or {}
    canary = rollout.get("canary")
    return str(canary) if canary and rollout.get("canaryPercent") else None


def other_ingests(real_cluster: RealCluster, rel: Release) -> list[str]:
    """Ingest Deployments of other releases (a learning loop run by hand shows in none)."""
    apps: Any = real_cluster.apps()
    sel = "app.kubernetes.io/component=ingest"
    items = apps.list_deployment_for_all_namespaces(label_selector=sel).items
    return [
        f"{d.metadata.namespace}/{d.metadata.name}"
        for d in items
        if d.metadata.namespace != rel.namespace
    ]


def ingest_log(real_cluster: RealCluster, rel: Release) -> str:
    """The ingest container's log (the learning loop's ticks and errors)."""
    core: Any = real_cluster.core()
    sel = "app.kubernetes.io/component=ingest"
    pods = core.list_namespaced_pod(rel.namespace, label_selector=sel).items
    return "\n".join(
        str(core.read_namespaced_pod_log(p.metadata.name, rel.namespace)) for p in pods
    )


def compile_for(npz: Path, features: StateFeatures, spec: NCCLTuningPolicySpec) -> DecisionTable:
    return compile_table(NumpyPolicy.load(npz), features, spec)

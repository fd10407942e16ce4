"""The learning loop on real containers: a retrain on the real node changes what the next job runs.

On the chart's release (tests/real/conftest.py `release`: operator, ingest and
store on the real node), a learned policy with a 100 % canary share:

1. a PyTorchJob of 4 pods x 8 A100 through the real training operator gets
   its TuningRun and table from the operator (the shipped model);
2. its rewards reach the ingest as a sidecar sends them: the sidecar's own HTTPS
   client with a pod-bound ServiceAccount token, through the ingest Service
   (ClusterIP, kube-proxy's rules on this machine, certificate verified for the
   Service's DNS name). They come from the job's calls played through the real
   plugin `.so` on the simulator's surface for the job's own topology, where
   Tree runs 1.25x faster than Ring for all-reduce >= 32 MiB, which neither
   NCCL's cost model nor the shipped model knows. Up to 3 such jobs run, until
   their exploration measured NCCL's pick slower somewhere;
3. the policy's retraining trigger (minNewExperience, set once the rewards are
   in) makes the ingest's learning loop create the retraining Job; its pod runs
   the trainer image to completion on the real node, the loop registers the
   model and starts its canary;
4. the next job's TuningRun names the new version as its canary model, and its
   table is the one compiled from the new model (so the operator fetched it);
5. the effect: compiled for that job, the new model's table differs from its
   parent's in every cell where the rewards showed NCCL's pick slower (and runs
   the faster configuration the rewards measured there), and keeps the parent's
   choice in every other cell the rewards measured.

Stand-ins: the jobs' pods run on kwok nodes (the A100 nodes of the local
cluster; no container starts there), and the jobs' calls are played on this
machine by `dynamiccl.demo.harness_job.play_job` (the real plugin `.so`, the
sidecar's attribution, aggregation, baseline and exploration budget; times from
the simulator with a departure instead of GPUs), posting from here instead of
from a pod. The retraining Job, the ingest, the store, the loop, the operator and
the webhook are the real ones in real containers.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.harness_job import JobSpec, play_job
from dynamiccl.demo.sequence import STEP
from dynamiccl.demo.surface import Departure, Surface
from dynamiccl.demo.workload import Op, build_time_table
from dynamiccl.operator.controller import configmap
from dynamiccl.operator.learning.retrain import MODEL_VERSION_LABEL, POLICY_LABEL
from dynamiccl.policy.runtime.compile import compile_table
from dynamiccl.policy.runtime.encode import job_spec
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from tests.real.conftest import (
    HACK_DIR,
    NODE_NAME,
    RELEASE,
    RealCluster,
    Release,
    _cache_dir,
    _read_env,
    diagnose,
    wait_until,
)
from tests.real.learning_support import (
    Recorder,
    ServiceClient,
    bound_token,
    first_choices,
    ingest_service,
    measured_cells,
    slower_cells,
)

pytestmark = [pytest.mark.real]

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
PARENT_JOBS: Final = 3  # at most, before the retrain
RETRAIN_TIMEOUT_S: Final = 900
# the retraining Job on a 2-core node next to the chart's pods; a 5 s loop for the test
LEARNING: Final = {"learning.cpu": "1", "learning.memory": "2Gi", "learning.interval": "5"}


@dataclass
class Timings:
    """What the test measured (printed at the end; docs/development.md quotes them)."""

    values: dict[str, float]

    def mark(self, what: str, seconds: float) -> None:
        self.values[what] = round(seconds, 1)


@pytest.fixture
def learning_release(real_cluster: RealCluster, release: Release) -> Iterator[Release]:
    """The session's release with the trainer image imported and a retraining Job that fits."""
    up = subprocess.run(
        ["bash", str(HACK_DIR / "real-node.sh"), "up", "--no-build", "--with-trainer"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert up.returncode == 0, f"real-node.sh up --with-trainer:\n{up.stderr[-3000:]}"
    for line in up.stderr.splitlines():
        if "image" in line and "-train" in line:
            print(line)  # "import <ref> in N s" or "ok image <ref> (in containerd)"
    # the release's own values file (its null entries delete chart defaults, which
    # --reuse-values would fail the schema on) with the learning values on top
    values = _cache_dir() / "logs" / f"real-values-{release.namespace}.json"
    sets = [a for k, v in LEARNING.items() for a in ("--set", f"{k}={v}")]
    real_cluster.helm_run(
        "upgrade", RELEASE, "charts/dynamiccl", "-n", release.namespace, "-f", str(values), *sets
    )
    apps: Any = real_cluster.apps()

    def ingest_rolled() -> bool:
        d = apps.read_namespaced_deployment(release.ingest(), release.namespace)
        s = d.status
        return bool(
            s.observed_generation == d.metadata.generation
            and (s.updated_replicas or 0) == (s.available_replicas or 0) == 1
            and not s.unavailable_replicas
        )

    wait_until("the ingest with the learning values", ingest_rolled, 300)
    try:
        yield release
    finally:
        with contextlib.suppress(AssertionError):
            real_cluster.helm_run("rollback", RELEASE, "-n", release.namespace, "--wait")


def _policy(job_ns: str, min_new: int) -> dict[str, Any]:
    return {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "mode": "learned",
            "priority": 1000,  # the highest the CRD allows (ties: the name sorts first)
            "selector": {"namespaceSelector": {"matchLabels": {NS_LABEL: job_ns}}},
            "exploration": {"budgetPercent": 1.0},
            "retraining": {"minNewExperience": min_new, "canaryPercent": 100},
        },
    }


def _pytorchjob(name: str) -> dict[str, Any]:
    def replica(n: int) -> dict[str, Any]:
        ct = {
            "name": "pytorch",
            "image": "example.invalid/train:1",  # kwok nodes start no container
            "command": ["torchrun", "/workspace/train.py"],
            "resources": {"limits": {c.RESOURCE_GPU: "8"}},
        }
        pod = {"containers": [ct], "nodeSelector": A100}
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": pod}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "annotations": {c.ANNOTATION_TUNE: "true"}},
        "spec": {
            "nprocPerNode": "8",
            "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(3)},
        },
    }


@dataclass
class TunedJob:
    """A job as the operator tuned it: TuningRun, features, table."""

    name: str
    uid: str
    run: dict[str, Any]
    features: StateFeatures
    table: DecisionTable


def _tuned_job(real_cluster: RealCluster, ns: str, name: str) -> TunedJob:
    custom: Any = real_cluster.custom()
    core: Any = real_cluster.core()
    job = custom.create_namespaced_custom_object(*PT[:2], ns, PT[2], _pytorchjob(name))
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
    return TunedJob(name, job["metadata"]["uid"], run, features, table)


def _play(real_cluster: RealCluster, rel: Release, ns: str, job: TunedJob, work: Path) -> Recorder:
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
        played = play_job(spec, job.table, surface, work / "job", recorder, budget_percent=1.0)
    except RuntimeError as exc:
        pytest.fail(f"posting the rewards of {job.name}: {exc}; answers: {recorder.answers[-3:]}")
    finally:
        recorder.client.close()
    (work / "played.json").write_text(json.dumps(played.budget, indent=1))
    return recorder


def _finish(real_cluster: RealCluster, ns: str, job: TunedJob) -> None:
    """Wait until the loop synced the job's rewards into its TuningRun (which also stores
    the job's features for the retrain), then delete the job (its pods hold the A100 nodes)."""
    custom: Any = real_cluster.custom()
    obj = configmap.object_name(job.name)

    def synced() -> bool:  # the operator writes an empty reward summary; the loop the calls
        run = custom.get_namespaced_custom_object(*TR[:2], ns, TR[2], obj)
        return int(((run.get("status") or {}).get("reward") or {}).get("calls") or 0) > 0

    wait_until(f"the rewards of {job.name} in its TuningRun's status", synced, 120)
    custom.delete_namespaced_custom_object(*PT[:2], ns, PT[2], job.name)


def _retrain_job(real_cluster: RealCluster, rel: Release) -> dict[str, Any] | None:
    """The policy's finished retraining Job (as JSON), if any."""
    batch: Any = k8s.BatchV1Api(real_cluster.api)
    jobs = batch.list_namespaced_job(rel.namespace, label_selector=f"{POLICY_LABEL}={POLICY}")
    done = [j for j in jobs.items if j.status and (j.status.succeeded or j.status.failed)]
    if not done:
        return None
    api: Any = real_cluster.api
    out: dict[str, Any] = api.sanitize_for_serialization(done[-1])
    return out


def _finished_pod(real_cluster: RealCluster, rel: Release, job_name: str) -> Any:
    core: Any = real_cluster.core()
    pods = core.list_namespaced_pod(rel.namespace, label_selector=f"job-name={job_name}").items
    assert pods, f"no pod of the retraining Job {job_name}"
    return pods[-1]


def _canary(real_cluster: RealCluster) -> str | None:
    """The canary version the policy's status gives a share of the jobs."""
    custom: Any = real_cluster.custom()
    policy = custom.get_cluster_custom_object(*NTP[:2], NTP[2], POLICY)
    rollout = ((policy.get("status") or {}).get("learning") or {}).get("rollout") or {}
    canary = rollout.get("canary")
    return str(canary) if canary and rollout.get("canaryPercent") else None


def _ingest_log(real_cluster: RealCluster, rel: Release) -> str:
    """The ingest container's log (the learning loop's ticks and errors)."""
    core: Any = real_cluster.core()
    sel = "app.kubernetes.io/component=ingest"
    pods = core.list_namespaced_pod(rel.namespace, label_selector=sel).items
    return "\n".join(
        str(core.read_namespaced_pod_log(p.metadata.name, rel.namespace)) for p in pods
    )


def _compile(npz: Path, features: StateFeatures, spec: NCCLTuningPolicySpec) -> DecisionTable:
    return compile_table(NumpyPolicy.load(npz), features, spec)


def test_a_retrain_on_the_real_node_changes_the_next_jobs_table_where_nccl_was_slower(
    real_cluster: RealCluster, learning_release: Release, tmp_path: Path
) -> None:
    rel = learning_release
    core: Any = real_cluster.core()
    custom: Any = real_cluster.custom()
    timings = Timings({})
    ns = f"dcl-learn-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns, "labels": {NS_LABEL: ns}}})
    # no retraining by count until job 1's rewards are in (the store may hold other rows)
    custom.create_cluster_custom_object(*NTP[:2], NTP[2], _policy(ns, 0))
    try:
        # jobs on the parent model until their exploration measured NCCL's pick slower
        # somewhere (exploration is randomised per job; the first job usually does)
        batches: list[RewardBatch] = []
        for i in range(1, PARENT_JOBS + 1):
            t0 = time.monotonic()
            job1 = _tuned_job(real_cluster, ns, f"learn-{i}")
            timings.mark(f"job {i} created -> table for its pods (s)", time.monotonic() - t0)
            t0 = time.monotonic()
            batches += _play(real_cluster, rel, ns, job1, tmp_path / f"job{i}").batches
            timings.mark(f"job {i}: {CALLS} calls played and posted (s)", time.monotonic() - t0)
            _finish(real_cluster, ns, job1)
            if slower_cells(batches):
                break
        parent_version = job1.run["spec"]["modelVersion"]
        slow = slower_cells(batches)
        measured = measured_cells(batches)
        assert slow, (
            f"{i} jobs' rewards show no cell where NCCL's pick is slower: {sorted(measured)}"
        )

        # the trigger: retraining due at the next pass of the loop
        t0 = time.monotonic()
        custom.patch_cluster_custom_object(
            *NTP[:2], NTP[2], POLICY, {"spec": {"retraining": {"minNewExperience": 1}}}
        )
        try:
            wait_until(
                "the retraining Job to finish",
                lambda: bool(_retrain_job(real_cluster, rel)),
                RETRAIN_TIMEOUT_S,
                2.0,
            )
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}\n{diagnose(real_cluster, rel.namespace)}")
        job = _retrain_job(real_cluster, rel)
        assert job is not None
        timings.mark("trigger -> retraining Job finished (s)", time.monotonic() - t0)
        version = job["metadata"]["labels"][MODEL_VERSION_LABEL]
        pod = _finished_pod(real_cluster, rel, job["metadata"]["name"])
        assert job["status"].get("succeeded"), diagnose(real_cluster, rel.namespace)
        # on the real node, the trainer image, run to completion
        assert pod.spec.node_name == NODE_NAME
        images = _read_env(_cache_dir() / "images" / "images.env")
        assert pod.spec.containers[0].image == images["DYNAMICCL_IMAGE_TRAIN"]
        (status,) = pod.status.container_statuses
        term = status.state.terminated
        assert term is not None
        assert term.exit_code == 0
        timings.mark(
            "retraining pod: container start -> exit (s)",
            (term.finished_at - term.started_at).total_seconds(),
        )
        parent = job["metadata"]["annotations"][f"{c.GROUP}/parent-model-version"]
        assert parent == parent_version  # fine-tunes the version job 1 ran

        # registered, its canary started: the policy's status names it
        t0 = time.monotonic()
        wait_until(
            f"the canary {version} in the policy's status",
            lambda: _canary(real_cluster) == version,
            120,
        )
        timings.mark("Job finished -> canary in status.learning (s)", time.monotonic() - t0)

        # job 2: the operator assigns the canary and compiles its table from the fetched model
        t0 = time.monotonic()
        job2 = _tuned_job(real_cluster, ns, "learn-next")
        timings.mark("next job created -> table for its scheduled pods (s)", time.monotonic() - t0)
        policy = custom.get_cluster_custom_object(*NTP[:2], NTP[2], POLICY)
        rollout = ((policy.get("status") or {}).get("learning") or {}).get("rollout")
        assert job2.run["spec"]["modelVersion"] == version, (
            f"policy rollout {rollout}\n{diagnose(real_cluster, rel.namespace)}"
        )
        assert job2.run["spec"]["canary"] is True

        spec = NCCLTuningPolicySpec.model_validate(_policy(ns, 1)["spec"])
        models = rel.volume / "models"
        parent_npz = DEFAULT_NPZ if parent == "default" else models / parent / "model.npz"
        before = first_choices(_compile(parent_npz, job2.features, spec))
        after = first_choices(_compile(models / version / "model.npz", job2.features, spec))
        # job 2's table is the new model's (the operator fetched and compiled it)
        assert first_choices(job2.table) == after
        # job 1's was the parent's
        assert first_choices(job1.table) == first_choices(_compile(parent_npz, job1.features, spec))

        # evidence kept with the test's files: the model's manifest and metrics, the store
        evidence = tmp_path / "evidence"
        shutil.copytree(models / version, evidence / version)
        shutil.copyfile(rel.store_db(), evidence / "experience.db")
        (evidence / "features.json").write_text(job2.features.model_dump_json(indent=1))
        metrics = json.loads((models / version / "metrics.json").read_text()).get("metrics", {})
        offline = {k: v for k, v in metrics.items() if k.startswith("offline/")}
        (evidence / "ingest.log").write_text(_ingest_log(real_cluster, rel))

        # the effect: different exactly where the rewards showed NCCL's pick slower
        for cell, (algo, proto, speedup) in slow.items():
            assert before.get(cell) != (algo, proto), (cell, "the parent already ran it")
            assert after.get(cell) == (algo, proto), (
                f"{cell}: the rewards measured {algo.value}/{proto.value} {speedup:.3f}x faster "
                f"than NCCL's pick; the retrained table runs {after.get(cell)} (parent: "
                f"{before.get(cell)}); retrain {offline}; evidence in {evidence}"
            )
        for cell in measured - set(slow):
            assert after.get(cell) == before.get(cell), (cell, before.get(cell), after.get(cell))
        unmeasured = {k for k in set(before) | set(after) if k not in measured}
        changed_elsewhere = sorted(
            (k[0].value, k[1], k[2]) for k in unmeasured if before.get(k) != after.get(k)
        )
        print(
            json.dumps(
                {
                    "learning_real": timings.values,
                    "slower_cells": {
                        f"{k[0].value}/{k[1]}/{k[2]}": [a.value, p.value, round(s, 3)]
                        for k, (a, p, s) in slow.items()
                    },
                    "measured_cells": len(measured),
                    "unmeasured_cells_changed": changed_elsewhere,
                    "model": version,
                    "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                }
            )
        )
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(*NTP[:2], NTP[2], POLICY)
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)

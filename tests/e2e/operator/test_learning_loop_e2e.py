"""The chart's learning loop on the real control plane, with the chart's own RBAC.

The ingest Deployment of `helm install` runs here as a local process with the
chart's exact arguments (store, TLS and port adapted to this machine) and the
token of the chart's ServiceAccount. It must write a tuned job's measured
speedup into the TuningRun the operator created, the env-knob experiment into
the learned policy's status, and — when retraining is
due — create the retraining Job in the release namespace as the chart's
`-train` ServiceAccount, which the real Job controller turns into a pod (the
ServiceAccount admission plugin refuses pods naming a ServiceAccount that
does not exist).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.learning.retrain import POLICY_LABEL
from dynamiccl.operator.store.experience import open_store
from dynamiccl.testing.certs import write_self_signed
from dynamiccl.testing.ports import free_port
from dynamiccl.testing.waiting import wait_for
from tests import reward_samples
from tests.e2e.operator.jobs import PT, create, pytorchjob, tuning_run
from tests.e2e.operator.release import (
    NTP,
    Release,
    chart_arg,
    chart_deployment,
    service_account_kubeconfig,
)

LOOP_LABEL = "loop-policy"  # selects the test's namespace for its policy alone
LOCAL = ("--store=", "--tls-cert=", "--tls-key=", "--port=", "--loop-interval=")


def _reward(job: dict[str, Any], ns: str, seq: int) -> RewardBatch:
    """What the job's sidecars reported: 3 buckets, 100 calls each, 1.25x NCCL's default."""
    meta = job["metadata"]
    return reward_samples.batch(
        f"pod-{meta['uid']}/{seq}",
        {"namespace": ns, "kind": "PyTorchJob", "name": meta["name"], "uid": meta["uid"]},
        {"name": f"{meta['name']}-master-0", "uid": f"pod-{meta['uid']}"},
        [reward_samples.record(16 + i) for i in range(3)],
    )


def test_the_charts_ingest_syncs_rewards_and_starts_retraining(
    release: Release, tuned_namespace: str, tmp_path: Path
) -> None:
    ns = tuned_namespace
    core, custom = k8s.CoreV1Api(release.api), k8s.CustomObjectsApi(release.api)
    batch_api = k8s.BatchV1Api(release.api)
    job = create(release, ns, PT, pytorchjob("loop", {c.ANNOTATION_TUNE: "true"}, workers=1))
    wait_for("the job's TuningRun", lambda: tuning_run(release, ns, "loop"))

    # The experience the ingest had stored from the job's sidecars (2 batches = 6 rows).
    db = tmp_path / "experience.db"
    store = open_store(str(db))
    for seq in (1, 2):
        store.insert_batch(_reward(job, ns, seq))
    store.close()

    # The primary learned policy (top priority, name sorting first), retraining due at 6 rows.
    # A loop follows only the policies that select the jobs of its store (policy_scope), so it
    # selects this job's namespace by a label set here alone (removed at the end: it tunes
    # nothing of the other tests).
    policy = f"0-loop-{uuid.uuid4().hex[:6]}"
    core.patch_namespace(ns, {"metadata": {"labels": {LOOP_LABEL: policy}}})
    custom.create_cluster_custom_object(
        *NTP,
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": policy},
            "spec": {
                "mode": "learned",
                "priority": 1000,
                "selector": {"namespaceSelector": {"matchLabels": {LOOP_LABEL: policy}}},
                "retraining": {"minNewExperience": 6},
                "constraints": {
                    "envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256, 512], "default": 512}]
                },
            },
        },
    )

    deploy = chart_deployment(release.manifest, "ingest")
    pod = deploy["spec"]["template"]["spec"]
    chart_args = [str(a) for a in pod["containers"][0]["args"]]
    cert, key = write_self_signed(tmp_path / "tls", ("127.0.0.1",))
    kubeconfig = service_account_kubeconfig(
        release.kubeconfig, core, release.namespace, pod["serviceAccountName"], tmp_path
    )
    argv = [a for a in chart_args if not a.startswith(LOCAL)]
    argv += [f"--store={db}", f"--tls-cert={cert}", f"--tls-key={key}", "--host=127.0.0.1"]
    argv += [f"--port={free_port()}", f"--kubeconfig={kubeconfig}", "--loop-interval=0.5"]
    log = (tmp_path / "ingest.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dynamiccl.operator.ingest.main", *argv],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()

    def alive() -> None:
        assert proc.poll() is None, (tmp_path / "ingest.log").read_text()[-3000:]

    def status_calls() -> int | None:
        alive()
        reward = (tuning_run(release, ns, "loop").get("status") or {}).get("reward") or {}
        return reward.get("calls")

    selector = f"{POLICY_LABEL}={policy}"
    try:
        assert wait_for("the reward in the TuningRun status", status_calls, 60) == 600
        reward = tuning_run(release, ns, "loop")["status"]["reward"]
        assert abs(reward["speedup"] - 1.25) < 1e-6

        def retrain_job() -> Any:
            alive()
            items = batch_api.list_namespaced_job(release.namespace, label_selector=selector).items
            return items[0] if items else None

        # the env-knob experiment's status: written through the policy's status subresource
        # under the chart's RBAC; the job's hardware class is its one cohort, whose arms are
        # the policy's allowed NCCL_NTHREADS values. The loop may write it before the job's
        # features reached the store (no cohort yet: fc12 read that and failed), so wait for
        # the cohort, not for the first write
        def knob_status() -> Any:
            alive()
            obj = cast(dict[str, Any], custom.get_cluster_custom_object(*NTP, policy))  # JSON
            knobs = (obj.get("status") or {}).get("envKnobs")
            return knobs if knobs and knobs.get("cohorts") else None

        knobs = wait_for("the policy's status.envKnobs", knob_status, 60)
        [cohort] = knobs["cohorts"]
        values = {k["value"] for arm in cohort["arms"] for k in arm["knobs"]}
        assert values == {256, 512}, cohort
        assert knobs["updated"].endswith("Z")

        rjob = wait_for("the retraining Job", retrain_job, 60)
        spec = rjob.spec.template.spec
        assert spec.service_account_name == chart_arg(chart_args, "--loop-service-account")
        assert spec.containers[0].image == chart_arg(chart_args, "--loop-image")
        claims = [
            v.persistent_volume_claim.claim_name for v in spec.volumes if v.persistent_volume_claim
        ]
        assert claims == [
            v["persistentVolumeClaim"]["claimName"]
            for v in pod["volumes"]
            if "persistentVolumeClaim" in v
        ]
        # the Job controller could create its pod: the ServiceAccount exists
        wait_for(
            "the retraining Job's pod",
            lambda: (
                core.list_namespaced_pod(
                    release.namespace, label_selector=f"job-name={rjob.metadata.name}"
                ).items
            ),
            60,
        )
    finally:
        proc.terminate()
        proc.wait(20)
        core.patch_namespace(ns, {"metadata": {"labels": {LOOP_LABEL: None}}})
        try:
            custom.delete_cluster_custom_object(*NTP, policy)
        except ApiException as exc:
            if exc.status != 404:
                raise
        batch_api.delete_collection_namespaced_job(
            release.namespace, label_selector=selector, propagation_policy="Background"
        )

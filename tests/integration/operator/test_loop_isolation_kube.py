"""One job's bad record never stalls every job's TuningRun status (issue 19, item 5).

Against a REAL kube-apiserver: job `bad` has a row stored with an absurd
measured time (a 1e-300 µs mean, as rows stored before the ingest refused such
values), job `good` a normal one. One sync of the learning loop must leave
`good`'s status.reward set, report anything it could not patch as an error of
that job only, and advance its cursor: the next sync patches only jobs that
reported since. A TuningRun status the API server refuses (here: a
ValidatingAdmissionPolicy denying `bad`'s status updates) is one job's error too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl.api.rewards import RewardBatch, RewardRecord
from dynamiccl.operator.kube import Kube
from dynamiccl.operator.learning.loop import TUNING_RUNS, LearningLoop, LoopConfig
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.registry import ModelRegistry
from tests import reward_samples

GROUP, VERSION = "dynamiccl.io", "v1alpha1"


def run(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TuningRun",
        "metadata": {"name": f"{name}-dynamiccl", "namespace": ns},
        "spec": {
            "jobRef": {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": name,
                "uid": f"uid-{name}",
            }
        },
    }


def stored_batch(ns: str, name: str, seq: int, mean_us: float) -> RewardBatch:
    ok = reward_samples.batch(
        f"pod-{name}/{seq}",
        {"namespace": ns, "kind": "PyTorchJob", "name": name, "uid": f"uid-{name}"},
        {"name": f"{name}-worker-0", "uid": f"pod-{name}"},
        [reward_samples.record(16)],
    )
    rec = RewardRecord.model_construct(**{**ok.records[0].__dict__, "mean_time_us": mean_us})
    return RewardBatch.model_construct(**{**ok.__dict__, "records": (rec,)})


@pytest.fixture
def ns(api: k8s.ApiClient) -> Iterator[str]:
    name = f"loop-iso-{uuid.uuid4().hex[:6]}"
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]  # the client takes dict bodies
    for job in ("bad", "good", "denied"):
        custom.create_namespaced_custom_object(GROUP, VERSION, name, "tuningruns", run(name, job))
    yield name
    core.delete_namespace(name)


def deny_status_of(api: k8s.ApiClient, ns: str, run_name: str) -> str:
    """A ValidatingAdmissionPolicy (+ binding) refusing every update of one TuningRun."""
    adm = k8s.AdmissionregistrationV1Api(api)
    name = f"deny-{ns}"
    adm.create_validating_admission_policy(
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [GROUP],
                            "apiVersions": [VERSION],
                            "operations": ["UPDATE"],
                            "resources": ["tuningruns/status"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"object.metadata.name != '{run_name}'",
                        "message": "denied by the test",
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
                },
            },
        }
    )
    return name


def test_one_bad_job_never_blocks_the_others(
    api: k8s.ApiClient, cluster_kubeconfig: Path, ns: str, tmp_path: Path
) -> None:
    adm = k8s.AdmissionregistrationV1Api(api)
    vap = deny_status_of(api, ns, "denied-dynamiccl")
    store = open_store(str(tmp_path / "experience.db"))
    kube = Kube(str(cluster_kubeconfig))
    try:
        store.insert_batch(stored_batch(ns, "bad", 1, 1e-300))
        store.insert_batch(stored_batch(ns, "denied", 1, 40.0))
        store.insert_batch(stored_batch(ns, "good", 1, 40.0))
        time.sleep(1.1)  # older than the sync's 1 s overlap: the next sync sees them once
        loop = LearningLoop(
            store,
            ModelRegistry(store.backend),
            kube,
            LoopConfig(namespace=ns, image="x", store_url="x", pvc_name="x"),
        )
        deadline = time.monotonic() + 20  # the policy takes a moment to be enforced
        while True:
            loop._synced_until = 0.0
            rep = loop.tick()
            errors = [e for e in rep.errors if e.startswith("status")]
            if any("denied" in e for e in errors) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(errors) == 1, errors
        assert f"{ns}/denied" in errors[0]
        assert rep.statuses_patched == 2
        good = kube.get(TUNING_RUNS, "good-dynamiccl", ns)
        assert good["status"]["reward"]["calls"] == 100
        assert abs(good["status"]["reward"]["speedup"] - 1.25) < 1e-6
        bad = kube.get(TUNING_RUNS, "bad-dynamiccl", ns)
        assert bad["status"]["reward"]["calls"] == 100
        # the cursor advanced: nothing new, nothing to patch, no error repeated
        rep = loop.tick()
        assert rep.statuses_patched == 0
        assert [e for e in rep.errors if e.startswith("status")] == []
    finally:
        store.close()
        for delete in (
            adm.delete_validating_admission_policy_binding,
            adm.delete_validating_admission_policy,
        ):
            try:
                delete(vap)
            except ApiException as exc:
                if exc.status != 404:
                    raise

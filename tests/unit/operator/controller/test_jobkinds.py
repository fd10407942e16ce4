"""Job shapes of every watched kind; malformed jobs name the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dynamiccl import constants as c
from dynamiccl.api.tuning_policy import JobKind
from dynamiccl.operator.controller import jobkinds


def test_pytorchjob_shape(pytorchjob: Callable[..., dict[str, Any]]) -> None:
    shape = jobkinds.job_shape(pytorchjob(workers=3))
    assert shape.kind is JobKind.PYTORCHJOB
    assert (shape.replicas, shape.gpus_per_pod, shape.nproc_per_node) == (4, 8, 8)
    assert shape.world_size == 32
    assert shape.unknown == ()


def test_pytorchjob_numeric_nproc(pytorchjob: Callable[..., dict[str, Any]]) -> None:
    assert jobkinds.job_shape(pytorchjob(workers=1, nproc="4")).world_size == 8


def test_mpijob_launcher_does_not_train() -> None:
    job = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "spec": {
            "slotsPerWorker": 8,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [{"name": "l"}]}}},
                "Worker": {
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "w", "resources": {"limits": {c.RESOURCE_GPU: 8}}}
                            ]
                        }
                    },
                },
            },
        },
    }
    groups = jobkinds.replica_groups(job)
    assert [(g.role, g.trains) for g in groups] == [("Launcher", False), ("Worker", True)]
    shape = jobkinds.job_shape(job)
    assert (shape.replicas, shape.nproc_per_node, shape.world_size) == (2, 8, 16)


def test_jobset_and_trainjob() -> None:
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "spec": {
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "template": {
                                "spec": {
                                    "containers": [
                                        {"name": "t", "resources": {"limits": {c.RESOURCE_GPU: 4}}}
                                    ]
                                }
                            },
                        }
                    },
                }
            ]
        },
    }
    shape = jobkinds.job_shape(jobset)
    assert (shape.replicas, shape.gpus_per_pod, shape.world_size) == (4, 4, 16)
    assert jobkinds.replica_groups(jobset)[0].path[:3] == ("spec", "replicatedJobs", 0)
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "spec": {
            "trainer": {
                "numNodes": 3,
                "numProcPerNode": 8,
                "resourcesPerNode": {"limits": {c.RESOURCE_GPU: "8"}},
            }
        },
    }
    shape = jobkinds.job_shape(trainjob)
    assert (shape.kind, shape.replicas, shape.world_size) == (JobKind.TRAINJOB, 3, 24)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({}, "pytorchReplicaSpecs: missing"),
        ({"pytorchReplicaSpecs": {"Worker": {"replicas": "many"}}}, "Worker.replicas"),
        ({"pytorchReplicaSpecs": {"Worker": {"replicas": -1}}}, "out of range"),
        ({"pytorchReplicaSpecs": {"Worker": []}}, "expected an object"),
    ],
)
def test_malformed_jobs_name_the_field(spec: dict[str, Any], needle: str) -> None:
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": spec}
    with pytest.raises(jobkinds.JobShapeError, match=needle):
        jobkinds.job_shape(job)


def test_kind_of_checks_the_group() -> None:
    assert jobkinds.kind_of({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"})
    assert jobkinds.kind_of({"apiVersion": "example.com/v1", "kind": "PyTorchJob"}) is None


def test_job_name_of_pod() -> None:
    assert jobkinds.job_name_of_pod({"metadata": {"labels": {c.LABEL_JOBSET_NAME: "js"}}}) == "js"
    owned = {"metadata": {"ownerReferences": [{"kind": "MPIJob", "name": "m", "controller": True}]}}
    assert jobkinds.job_name_of_pod(owned) == "m"
    assert jobkinds.job_name_of_pod({"metadata": {}}) is None
    launcher = {"metadata": {"labels": {c.LABEL_KUBEFLOW_REPLICA_TYPE: "launcher"}}}
    assert not jobkinds.trains(launcher)


def test_mpijob_v1_of_the_training_operator_is_watched_too() -> None:
    v1 = jobkinds.info_for("kubeflow.org/v1", "MPIJob")
    assert v1 is not None
    assert (v1.kind, v1.plural) == (JobKind.MPIJOB, "mpijobs")
    assert [i.version for i in jobkinds.versions_of(JobKind.MPIJOB)] == ["v2beta1", "v1"]
    assert jobkinds.info_for("kubeflow.org/v1beta1", "MPIJob") is None
    assert jobkinds.info_for("kubeflow.org/v1", "TFJob") is None
    assert len({(i.api_version, i.kind) for i in jobkinds.WATCHED}) == len(jobkinds.WATCHED)
    worker = {"replicas": 2, "template": {"spec": {"containers": [{"name": "w"}]}}}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "MPIJob",
        "spec": {"slotsPerWorker": 4, "mpiReplicaSpecs": {"Worker": worker}},
    }
    assert jobkinds.job_shape(job).world_size == 8


def _pod(labels: dict[str, str], refs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"labels": labels, "ownerReferences": refs}}


def test_job_candidates_try_the_owner_version_first() -> None:
    name = {c.LABEL_KUBEFLOW_JOB_NAME: "j"}
    ref = {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "name": "j", "controller": True}
    got = [(i.kind.value, i.version) for i in jobkinds.job_candidates(_pod(name, [ref]))]
    assert got == [("MPIJob", "v1"), ("MPIJob", "v2beta1")]
    got = [(i.kind.value, i.version) for i in jobkinds.job_candidates(_pod(name, []))]
    assert got == [("PyTorchJob", "v1"), ("MPIJob", "v2beta1"), ("MPIJob", "v1")]
    js = _pod({c.LABEL_JOBSET_NAME: "j"}, [])
    assert [i.kind for i in jobkinds.job_candidates(js)] == [JobKind.TRAINJOB, JobKind.JOBSET]
    with pytest.raises(jobkinds.JobShapeError):
        jobkinds.job_candidates({"metadata": {"labels": ["not", "a", "map"]}})

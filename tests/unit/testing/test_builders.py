"""dynamiccl.testing.builders: the operator's own job and pod readers (controller/jobkinds.py)
see in a built PyTorchJob and its pods what the builder was asked for."""

from __future__ import annotations

import pytest

from dynamiccl.api.tuning_policy import JobKind
from dynamiccl.operator.controller import jobkinds
from dynamiccl.testing import builders


@pytest.mark.parametrize(("workers", "gpus", "nproc"), [(0, 1, "1"), (3, 8, "auto"), (1, 4, None)])
def test_the_operator_reads_the_shape_asked_for(workers: int, gpus: int, nproc: str | None) -> None:
    env = {"NCCL_ALGO": "Ring"}
    job = builders.pytorchjob(
        "llm",
        namespace="ml",
        workers=workers,
        pod=builders.template(builders.container(gpus=gpus, env=env)),
        nproc_per_node=nproc,
        suspend=True,
    )
    shape = jobkinds.job_shape(job)
    assert shape.kind is JobKind.PYTORCHJOB
    assert (shape.replicas, shape.gpus_per_pod, shape.nproc_per_node) == (1 + workers, gpus, gpus)
    assert shape.unknown == ()
    groups = jobkinds.replica_groups(job)
    assert [g.role for g in groups] == ["Master", "Worker"][: 1 + bool(workers)]
    assert all(jobkinds.user_constraints(g.template["spec"]) == env for g in groups if g.template)
    assert not jobkinds.finished(job)


def test_a_pod_is_tied_to_its_job_as_the_training_operator_ties_it() -> None:
    job = builders.pytorchjob("llm", namespace="ml", uid="u-1", workers=2)
    pod = builders.pod_of(job, 1, "node-3")
    assert pod["metadata"]["name"] == "llm-worker-1"
    assert jobkinds.job_name_of_pod(pod) == "llm"
    assert jobkinds.job_uid_of_pod(pod) == "u-1"
    assert jobkinds.trains(pod)
    assert pod["spec"]["nodeName"] == "node-3"
    pod["spec"]["containers"][0]["image"] = "changed"  # the pod has its own copy
    assert (
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"]
        == builders.IMAGE
    )


def test_the_master_can_differ_or_be_left_out() -> None:
    def sa(name: str) -> dict[str, object]:
        return builders.template(builders.container(gpus=0), service_account=name)

    job = builders.pytorchjob("llm", workers=2, pod=sa("w"), master_pod=sa("m"))
    groups = {g.role: g.template for g in jobkinds.replica_groups(job)}
    assert {r: t["spec"]["serviceAccountName"] for r, t in groups.items() if t} == {
        "Master": "m",
        "Worker": "w",
    }
    worker_only = builders.pytorchjob("llm", workers=2, master=False)
    assert [g.role for g in jobkinds.replica_groups(worker_only)] == ["Worker"]
    assert jobkinds.job_shape(worker_only).replicas == 2

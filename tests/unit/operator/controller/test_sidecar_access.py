"""The sidecar's API rights: exactly its job's three coordination objects, bound to its pods."""

from __future__ import annotations

from typing import Any

import pytest

from dynamiccl.api import sidecar_objects
from dynamiccl.operator.controller import configmap, sidecar_access
from dynamiccl.testing import builders

JOB = configmap.JobRef(
    api_version="kubeflow.org/v1", kind="PyTorchJob", name="llm", namespace="team-a", uid="u-1"
)


def _pytorchjob(master_sa: str | None, worker_sa: str | None) -> dict[str, Any]:
    def tmpl(sa: str | None) -> dict[str, Any]:
        return builders.template(builders.container(gpus=0, image="x"), service_account=sa)

    return builders.pytorchjob(
        "llm",
        namespace="team-a",
        uid="u-1",
        workers=3,
        pod=tmpl(worker_sa),
        master_pod=tmpl(master_sa),
        nproc_per_node=None,
    )


def _mpijob(launcher_sa: str, worker_sa: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "m", "namespace": "team-a", "uid": "u-2"},
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "template": {"spec": {"serviceAccountName": launcher_sa}},
                },
                "Worker": {"replicas": 2, "template": {"spec": {"serviceAccountName": worker_sa}}},
            }
        },
    }


@pytest.mark.parametrize(
    ("job", "want"),
    [
        (_pytorchjob(None, None), ("default",)),
        (_pytorchjob("trainer", None), ("default", "trainer")),
        (_pytorchjob("trainer", "trainer"), ("trainer",)),
        (_mpijob("launcher-sa", "worker-sa"), ("worker-sa",)),  # the launcher runs no rank
        (
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {"name": "t", "namespace": "team-a"},
                "spec": {"trainer": {"numNodes": 2}},
            },
            None,  # pods come from the runtime: the object cannot say
        ),
        ({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": "garbage"}, None),
    ],
)
def test_service_accounts_of_the_training_pods(job: dict[str, Any], want: Any) -> None:
    assert sidecar_access.service_accounts(job) == want


def test_role_grants_only_named_coordination_objects_and_no_create() -> None:
    access = sidecar_access.build(JOB, ("default",), pods=2000)
    (rule,) = access.role["rules"]
    assert rule["apiGroups"] == [""]
    assert rule["resources"] == ["configmaps"]
    names = [*sidecar_objects.coordination_names("llm"), *sidecar_objects.votes_names("llm", 2000)]
    assert len(names) == 3 + 63  # 2 000 pods: 63 ballot objects of at most 32 pods
    assert sorted(rule["resourceNames"]) == sorted(names)
    assert sorted(rule["verbs"]) == ["get", "patch", "update"]  # no create/list/watch/delete
    assert [cm["metadata"]["name"] for cm in access.config_maps] == names
    for cm in access.config_maps:
        assert "data" not in cm  # empty: the sidecars write the content
        assert "binaryData" not in cm


def test_everything_is_owned_by_the_job_and_labelled() -> None:
    access = sidecar_access.build(JOB, ("default",))
    for obj in (*access.config_maps, access.role, access.role_binding):
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [JOB.owner_reference()]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "dynamiccl"
        assert meta["labels"]["app.kubernetes.io/component"] != "job-config"  # not the watched CM


def test_binding_names_the_accounts_or_the_namespace_group() -> None:
    named = sidecar_access.build(JOB, ("default", "trainer")).role_binding
    assert named["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": sidecar_access.access_name("llm"),
    }
    assert named["subjects"] == [
        {"kind": "ServiceAccount", "name": "default", "namespace": "team-a"},
        {"kind": "ServiceAccount", "name": "trainer", "namespace": "team-a"},
    ]
    unknown = sidecar_access.build(JOB, None).role_binding
    assert unknown["subjects"] == [
        {
            "kind": "Group",
            "apiGroup": "rbac.authorization.k8s.io",
            "name": "system:serviceaccounts:team-a",
        }
    ]


def test_long_job_names_still_give_valid_distinct_names() -> None:
    long = configmap.JobRef(
        api_version="kubeflow.org/v1", kind="PyTorchJob", name="j" * 250, namespace="n", uid="u"
    )
    access = sidecar_access.build(long, None, pods=40)
    names = [cm["metadata"]["name"] for cm in access.config_maps]
    names.append(access.role["metadata"]["name"])
    assert len(set(names)) == 6  # 3, 2 ballot objects, the Role
    assert all(len(n) <= 253 for n in names)


def test_the_ballot_objects_follow_the_jobs_pods() -> None:
    """The operator counts the pods as the sidecars do (the job's training replicas)."""
    job = builders.pytorchjob(
        "llm",
        workers=1999,
        pod=builders.template({"name": "w"}),
        master_pod=builders.template({"name": "m"}),
        nproc_per_node=None,
    )
    assert sidecar_access.pods(job) == 2000
    assert sidecar_access.pods({"kind": "Unknown"}) == 1


def test_table_slots_cycle_and_reject_version_zero() -> None:
    keys = {sidecar_objects.table_key(v) for v in range(1, 3 * sidecar_objects.TABLE_SLOTS)}
    assert len(keys) == sidecar_objects.TABLE_SLOTS
    assert sidecar_objects.table_key(1) != sidecar_objects.table_key(2)
    assert sidecar_objects.table_key(1) == sidecar_objects.table_key(
        1 + sidecar_objects.TABLE_SLOTS
    )
    with pytest.raises(ValueError, match="version"):
        sidecar_objects.table_key(0)


def test_writer_pods_matches_each_kinds_pod_names_and_no_other_jobs() -> None:
    """Issue 19, item 4: the pattern the coordination policy checks a writer's pod against."""
    import re  # noqa: PLC0415

    pt = builders.pytorchjob("llm", pod={"spec": {}}, nproc_per_node=None)
    pattern = sidecar_access.writer_pods(pt)
    assert re.fullmatch(pattern.strip("^$"), "llm-worker-3")
    assert re.fullmatch(pattern.strip("^$"), "llm-master-0")
    for other in ("llm-worker-master-0", "llmx-worker-0", "other-worker-0", "llm-worker-0x"):
        assert not re.fullmatch(pattern.strip("^$"), other), other
    access = sidecar_access.build(
        configmap.JobRef("kubeflow.org/v1", "PyTorchJob", "llm", "ns", "u"), ("default",), pattern
    )
    for cm in access.config_maps:
        assert cm["metadata"]["annotations"][sidecar_access.WRITER_PODS_ANNOTATION] == pattern


def test_a_trainjobs_pattern_matches_no_pod_of_a_trainjob_extending_its_name() -> None:
    """Issue 32, smaller finding: TrainJob `t`'s pattern also matched the pods of TrainJob
    `t-foo` (`t-foo-node-0-0-abcde`), so t-foo's pods could write t's coordination."""
    import re  # noqa: PLC0415

    def trainjob(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"trainer": {"numNodes": 2}},
        }

    pattern = sidecar_access.writer_pods(trainjob("t"))
    for own in ("t-node-0-0-abcde", "t-node-0-1-x9z8y", "t-launcher-0-0-abcde"):
        assert re.fullmatch(pattern.strip("^$"), own), own
    for other in ("t-foo-node-0-0-abcde", "t-0-node-0-0-abcde", "tx-node-0-0-abcde"):
        assert not re.fullmatch(pattern.strip("^$"), other), other
    longer = sidecar_access.writer_pods(trainjob("t-foo"))
    assert re.fullmatch(longer.strip("^$"), "t-foo-node-0-0-abcde")

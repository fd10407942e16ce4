"""Training jobs for the operator's e2e tests: builders, and reading what became of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.testing import builders
from dynamiccl.testing.waiting import wait_for

if TYPE_CHECKING:
    from tests.e2e.operator.release import Release

PT = ("kubeflow.org", "v1", "pytorchjobs")
MPI = ("kubeflow.org", "v1", "mpijobs")
TR = ("dynamiccl.io", "v1alpha1", "tuningruns")
POD_TIMEOUT = 120


def _container(name: str, gpus: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    ct: dict[str, Any] = {
        "name": name,
        "image": "example.invalid/train:1",
        "command": ["torchrun", "/workspace/train.py"],
        "resources": {"limits": {c.RESOURCE_GPU: str(gpus)}} if gpus else {},
    }
    if env:
        ct["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return ct


def _template(ct: dict[str, Any], node_selector: dict[str, str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [ct]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"spec": spec}


def pytorchjob(
    name: str,
    annotations: dict[str, str],
    *,
    workers: int = 1,
    gpus: int = 8,
    env: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    ct = builders.container(gpus=gpus, env=env, command=["torchrun", "/workspace/train.py"])
    return builders.pytorchjob(
        name,
        annotations=annotations,
        workers=workers,
        pod=builders.template(ct, node_selector=node_selector),
        nproc_per_node=str(gpus or 1),
        restart_policy="OnFailure",
    )


def mpijob(name: str, annotations: dict[str, str], *, workers: int = 2) -> dict[str, Any]:
    launcher = _container("launcher", 0)
    launcher["command"] = ["mpirun", "-n", str(8 * workers), "python", "/workspace/train.py"]
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "MPIJob",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "slotsPerWorker": 8,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": _template(launcher, None)},
                "Worker": {
                    "replicas": workers,
                    "template": _template(_container("worker", 8), None),
                },
            },
        },
    }


def create(release: Release, ns: str, plural: tuple[str, str, str], job: dict[str, Any]) -> Any:
    return k8s.CustomObjectsApi(release.api).create_namespaced_custom_object(
        plural[0], plural[1], ns, plural[2], job
    )


def pods_of(release: Release, ns: str, job: str) -> list[Any]:
    core = k8s.CoreV1Api(release.api)
    sel = f"{c.LABEL_KUBEFLOW_JOB_NAME}={job}"
    return list(core.list_namespaced_pod(ns, label_selector=sel).items)


def running_pods(release: Release, ns: str, job: str, count: int) -> list[Any]:
    def ready() -> list[Any]:
        pods = pods_of(release, ns, job)
        ok = len(pods) == count and all(p.status.phase == "Running" for p in pods)
        return pods if ok else []

    return list(wait_for(f"{count} Running pods of {job}", ready, POD_TIMEOUT))


def tuning_run(release: Release, ns: str, job: str) -> dict[str, Any]:
    obj = k8s.CustomObjectsApi(release.api).get_namespaced_custom_object(
        *TR[:2], ns, TR[2], f"{job}-dynamiccl"
    )
    return dict(cast(dict[str, Any], obj))  # the custom-objects API returns the object's JSON


def scheduled_run(release: Release, ns: str, job: str) -> dict[str, Any]:
    """The TuningRun once refined from the bound pods, spec and status: the operator writes
    the spec, then the status (two requests), so a read between them pairs the refined
    spec with the previous pass's conditions (Scheduled=False)."""

    def refined() -> dict[str, Any] | None:
        tr = tuning_run(release, ns, job)
        conds = {x["type"]: x["status"] for x in (tr.get("status") or {}).get("conditions", [])}
        scheduled = tr["spec"].get("features", {}).get("scheduled")
        return tr if scheduled and conds.get("Scheduled") == "True" else None

    return dict(wait_for(f"TuningRun of {job} refined from its pods' nodes", refined, 90))


def gone(read: Any) -> bool:
    try:
        read()
    except ApiException as exc:
        return bool(exc.status == 404)
    return False


def assert_untouched(pod: Any) -> None:
    assert not [i.name for i in pod.spec.init_containers or [] if i.name.startswith("dynamiccl")]
    assert not [v.name for v in pod.spec.volumes or [] if v.name.startswith("dynamiccl")]
    for ct in pod.spec.containers:
        names = {e.name for e in ct.env or []}
        assert c.ENV_NCCL_TUNER_PLUGIN not in names
        assert "NCCL_NTHREADS" not in names
    assert not [k for k in pod.metadata.annotations or {} if k.startswith(c.GROUP)]

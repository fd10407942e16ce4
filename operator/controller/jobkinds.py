"""The training-job kinds we watch, and how to read their shape and pod templates.

- PyTorchJob ``kubeflow.org/v1``: ``spec.pytorchReplicaSpecs.{Master,Worker}``,
  ``spec.nprocPerNode``.
- MPIJob ``kubeflow.org/v2beta1`` (mpi-operator) and ``kubeflow.org/v1`` (the
  Kubeflow training operator v1.x): ``spec.mpiReplicaSpecs.{Launcher,Worker}``,
  ``spec.slotsPerWorker`` (the launcher does not train).
- JobSet ``jobset.x-k8s.io/v1alpha2``: ``spec.replicatedJobs[].template.spec.template``.
- TrainJob ``trainer.kubeflow.org/v1alpha1``: ``spec.trainer.{numNodes,numProcPerNode,
  resourcesPerNode}``; its pods come from the JobSet it creates (same name).

Pure functions over plain dicts; malformed shapes raise ``JobShapeError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.tuning_policy import JobKind


class JobShapeError(ValueError):
    """The job object is not shaped as its kind requires; the message names the field."""


@dataclass(frozen=True)
class KindInfo:
    """API coordinates of one job kind."""

    kind: JobKind
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        """``group/version``."""
        return f"{self.group}/{self.version}"


KINDS: Final = {
    JobKind.PYTORCHJOB: KindInfo(JobKind.PYTORCHJOB, "kubeflow.org", "v1", "pytorchjobs"),
    JobKind.MPIJOB: KindInfo(JobKind.MPIJOB, "kubeflow.org", "v2beta1", "mpijobs"),
    JobKind.JOBSET: KindInfo(JobKind.JOBSET, "jobset.x-k8s.io", "v1alpha2", "jobsets"),
    JobKind.TRAINJOB: KindInfo(JobKind.TRAINJOB, "trainer.kubeflow.org", "v1alpha1", "trainjobs"),
}
# Other served versions of a kind with the same shape: the training operator v1.x serves
# MPIJob as kubeflow.org/v1 (mpi-operator v0.4+ serves v2beta1, the primary one above).
ALSO_SERVED: Final = (KindInfo(JobKind.MPIJOB, "kubeflow.org", "v1", "mpijobs"),)
# Every (kind, version) the operator watches.
WATCHED: Final = (*KINDS.values(), *ALSO_SERVED)


def versions_of(kind: JobKind) -> tuple[KindInfo, ...]:
    """Every watched version of a kind, the primary one first."""
    return tuple(i for i in WATCHED if i.kind is kind)


def info_for(api_version: str, kind: str) -> KindInfo | None:
    """The watched kind/version an ``apiVersion`` + ``kind`` pair names, if any."""
    return next((i for i in WATCHED if i.api_version == api_version and i.kind.value == kind), None)


# The condition types that say a job ended, with status "True": the training operator's
# and mpi-operator's Succeeded/Failed, JobSet's Completed/Failed, TrainJob's Complete/Failed.
FINISHED_CONDITIONS: Final = frozenset({"Succeeded", "Failed", "Completed", "Complete"})


def finished(job: Mapping[str, Any]) -> bool:
    """Has the job ended (succeeded or failed), as its own status conditions say?"""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        isinstance(cond, Mapping)
        and cond.get("type") in FINISHED_CONDITIONS
        and str(cond.get("status")) == "True"
        for cond in conditions
    )


Path = tuple[str | int, ...]


@dataclass(frozen=True)
class ReplicaGroup:
    """One group of identical pods of a job."""

    role: str
    replicas: int
    template: Mapping[str, Any] | None  # the PodTemplateSpec, None if the kind has none
    path: Path  # where the template lives inside the job object
    trains: bool = True  # runs NCCL ranks (an MPI launcher does not)


@dataclass(frozen=True)
class JobShape:
    """How many ranks a job has and how they are packed."""

    kind: JobKind
    replicas: int  # training pods
    gpus_per_pod: int
    nproc_per_node: int
    unknown: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.replicas * self.nproc_per_node


def kind_of(obj: Mapping[str, Any]) -> JobKind | None:
    """The job kind of an object, or None if it is not one we watch."""
    group = str(obj.get("apiVersion", "")).split("/", 1)[0]
    for info in KINDS.values():
        if info.kind.value == obj.get("kind") and info.group == group:
            return info.kind
    return None


def _get(obj: Any, path: Path, default: Any = None) -> Any:
    cur = obj
    for part in path:
        if isinstance(part, int):
            if not isinstance(cur, list) or part >= len(cur):
                return default
            cur = cur[part]
        elif isinstance(cur, Mapping):
            if part not in cur:
                return default
            cur = cur[part]
        else:
            return default
    return cur


def _count(value: Any, where: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise JobShapeError(f"{where}: expected an integer, got {value!r}")
    try:
        n = int(value)
    except ValueError:
        raise JobShapeError(f"{where}: expected an integer, got {value!r}") from None
    if n < 0 or n > 100_000:
        raise JobShapeError(f"{where}: {n} out of range 0..100000")
    return n


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise JobShapeError(f"{where}: expected an object")
    return value


def replica_groups(obj: Mapping[str, Any]) -> list[ReplicaGroup]:
    """Every pod group of the job, with where its pod template lives."""
    kind = kind_of(obj)
    if kind is None:
        raise JobShapeError(f"kind: {obj.get('kind')!r} ({obj.get('apiVersion')}) is not watched")
    spec = _mapping(obj.get("spec"), "spec")
    groups: list[ReplicaGroup] = []
    if kind in (JobKind.PYTORCHJOB, JobKind.MPIJOB):
        key = "pytorchReplicaSpecs" if kind is JobKind.PYTORCHJOB else "mpiReplicaSpecs"
        specs = _mapping(spec.get(key), f"spec.{key}")
        if not specs:
            raise JobShapeError(f"spec.{key}: missing or empty")
        for role in sorted(specs):
            rs = _mapping(specs[role], f"spec.{key}.{role}")
            groups.append(
                ReplicaGroup(
                    role=role,
                    replicas=_count(rs.get("replicas"), f"spec.{key}.{role}.replicas", 1),
                    template=_mapping(rs.get("template"), f"spec.{key}.{role}.template"),
                    path=("spec", key, role, "template"),
                    trains=role.lower() != "launcher",
                )
            )
    elif kind is JobKind.JOBSET:
        rjobs = spec.get("replicatedJobs")
        if not isinstance(rjobs, list) or not rjobs:
            raise JobShapeError("spec.replicatedJobs: missing or empty")
        for i, raw in enumerate(rjobs):
            where = f"spec.replicatedJobs[{i}]"
            rj = _mapping(raw, where)
            per_job = _count(
                _get(rj, ("template", "spec", "parallelism")), where + ".parallelism", 1
            )
            groups.append(
                ReplicaGroup(
                    role=str(rj.get("name", i)),
                    replicas=_count(rj.get("replicas"), where + ".replicas", 1) * per_job,
                    template=_mapping(_get(rj, ("template", "spec", "template")), where),
                    path=("spec", "replicatedJobs", i, "template", "spec", "template"),
                )
            )
    else:  # TrainJob: no pod template in the object (it is in the training runtime)
        trainer = _mapping(spec.get("trainer"), "spec.trainer")
        groups.append(
            ReplicaGroup(
                role="node",
                replicas=_count(trainer.get("numNodes"), "spec.trainer.numNodes", 1),
                template=None,
                path=(),
            )
        )
    return groups


def _gpus(resources: Any) -> int:
    res = _mapping(resources, "resources")
    for part in ("limits", "requests"):
        value = _mapping(res.get(part), f"resources.{part}").get(c.RESOURCE_GPU)
        if value is not None:
            return _count(value, f"resources.{part}.{c.RESOURCE_GPU}", 0)
    return 0


def template_gpus(template: Mapping[str, Any] | None) -> int:
    """GPUs a pod of this template requests (sum over its regular containers)."""
    containers = _get(template, ("spec", "containers"), []) or []
    if not isinstance(containers, list):
        raise JobShapeError("template.spec.containers: expected a list")
    return sum(_gpus(_mapping(ct, "container").get("resources")) for ct in containers)


def _nproc(value: Any, where: str, gpus: int, unknown: list[str]) -> int:
    if value is None or (isinstance(value, str) and value.lower() in ("auto", "gpu", "")):
        if gpus <= 0:
            unknown.append("nproc_per_node")
        return max(gpus, 1)
    if isinstance(value, str) and value.lower() == "cpu":
        unknown.append("nproc_per_node")
        return 1
    return max(_count(value, where, 1), 1)


def job_shape(obj: Mapping[str, Any]) -> JobShape:
    """Ranks, pods and GPUs of a job, from its spec alone (before any pod exists)."""
    kind = kind_of(obj)
    groups = [g for g in replica_groups(obj) if g.trains and g.replicas > 0]
    if kind is None or not groups:
        raise JobShapeError("spec: the job has no training replicas")
    unknown: list[str] = []
    spec = _mapping(obj.get("spec"), "spec")
    if kind is JobKind.TRAINJOB:
        trainer = _mapping(spec.get("trainer"), "spec.trainer")
        gpus = _gpus(trainer.get("resourcesPerNode"))
        nproc = _nproc(trainer.get("numProcPerNode"), "spec.trainer.numProcPerNode", gpus, unknown)
        if "numNodes" not in trainer:
            unknown.append("replicas")
    else:
        gpus = max(template_gpus(g.template) for g in groups)
        if kind is JobKind.PYTORCHJOB:
            raw = spec.get("nprocPerNode", _get(spec, ("elasticPolicy", "nProcPerNode")))
            nproc = _nproc(raw, "spec.nprocPerNode", gpus, unknown)
        elif kind is JobKind.MPIJOB:
            nproc = max(_count(spec.get("slotsPerWorker"), "spec.slotsPerWorker", 1), 1)
        else:
            nproc = _nproc(None, "", gpus, unknown)
    replicas = sum(g.replicas for g in groups)
    return JobShape(kind, replicas, gpus, min(nproc, 72), tuple(unknown))


def trains(pod: Mapping[str, Any]) -> bool:
    """False for pods that run no NCCL ranks (an MPI launcher)."""
    labels = _mapping(_get(pod, ("metadata", "labels")), "metadata.labels")
    for key in (c.LABEL_KUBEFLOW_REPLICA_TYPE, c.LABEL_KUBEFLOW_JOB_ROLE):
        if str(labels.get(key, "")).lower() == "launcher":
            return False
    return True


def job_name_of_pod(pod: Mapping[str, Any]) -> str | None:
    """The name of the training job (PyTorchJob, MPIJob, TrainJob/JobSet) a pod belongs to."""
    labels = _get(pod, ("metadata", "labels"), {}) or {}
    if not isinstance(labels, Mapping):
        return None
    for key in (c.LABEL_TRAINJOB_NAME, c.LABEL_JOBSET_NAME, c.LABEL_KUBEFLOW_JOB_NAME):
        value = labels.get(key)
        if isinstance(value, str) and value:
            return value
    for ref in _get(pod, ("metadata", "ownerReferences"), []) or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("controller")
            and ref.get("kind")
            in (
                JobKind.PYTORCHJOB.value,
                JobKind.MPIJOB.value,
            )
        ):
            name = ref.get("name")
            return name if isinstance(name, str) else None
    return None


def job_uid_of_pod(pod: Mapping[str, Any]) -> str | None:
    """The uid of the job a pod belongs to, when the pod names it: its controller
    ownerReference to a PyTorchJob or MPIJob (the training operator owns the pods itself).
    None for JobSet/TrainJob pods (owned by a batch Job) and pods without one."""
    for ref in _get(pod, ("metadata", "ownerReferences"), []) or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("controller")
            and ref.get("kind") in (JobKind.PYTORCHJOB.value, JobKind.MPIJOB.value)
        ):
            uid = ref.get("uid")
            return uid if isinstance(uid, str) and uid else None
    return None


def job_candidates(pod: Mapping[str, Any]) -> tuple[KindInfo, ...]:
    """The job kinds/versions a training pod may belong to, most likely first.

    A controller ownerReference naming a watched kind gives the exact version;
    JobSet/TrainJob labels mean one of those two; otherwise PyTorchJob or MPIJob.
    """
    meta = _mapping(pod.get("metadata"), "metadata")
    labels = _mapping(meta.get("labels"), "metadata.labels")
    refs = meta.get("ownerReferences") or []
    exact = [
        info
        for r in (refs if isinstance(refs, list) else [])
        if isinstance(r, Mapping)
        and (info := info_for(str(r.get("apiVersion", "")), str(r.get("kind", "")))) is not None
    ]
    if c.LABEL_JOBSET_NAME in labels or c.LABEL_TRAINJOB_NAME in labels:
        kinds = [JobKind.TRAINJOB, JobKind.JOBSET]
    else:
        owner_kinds = {r.get("kind") for r in refs if isinstance(r, Mapping)}
        kinds = [k for k in (JobKind.PYTORCHJOB, JobKind.MPIJOB) if k.value in owner_kinds]
        kinds = kinds or [JobKind.PYTORCHJOB, JobKind.MPIJOB]
    out = list(dict.fromkeys(exact))
    out += [i for k in kinds for i in versions_of(k) if i not in out]
    return tuple(out)


def _user_nccl_env(container: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in container.get("env") or []:
        name = str(item.get("name", ""))
        if name.startswith("NCCL_"):
            out[name] = str(item["value"]) if "value" in item else "<valueFrom>"
    return out


def user_constraints(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """The user's own NCCL_* env over all regular containers (kept, never overridden)."""
    out: dict[str, str] = {}
    for ct in pod_spec.get("containers") or []:
        out.update(_user_nccl_env(ct))
    return out

"""``dynamiccl inject``: manifests mutated exactly as the admission webhook mutates pods.

Only what the webhook would mutate: a job (or pod) that opted in, by its
``dynamiccl.io/tune: "true"`` annotation or, with ``namespace_opted_in``, by its
namespace's label, and whose annotations are valid (the operator writes no
ConfigMap otherwise, and the webhook mutates only pods whose job has one).
Anything else is printed unchanged with a note saying why.
Pods are mutated as a whole; training jobs (PyTorchJob, MPIJob, JobSet) get
every training pod template mutated in place (an MPI launcher is left alone);
a TrainJob has no pod template (its pods come from its training runtime) and
is printed unchanged with a note; anything else passes through untouched.
Uses the same builders as the webhook: ``configmap.object_name`` for the
ConfigMap reference, ``configmap.env_knobs`` for the policy's knobs,
``mutate.mutate_pod`` for the mutation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynamiccl import constants as c
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import configmap, jobkinds
from dynamiccl.operator.webhook import mutate


@dataclass(frozen=True)
class Settings:
    """What the operator would know: the image and the matched policy."""

    image: str
    policy: NCCLTuningPolicySpec | None = None
    ingest_url: str = ""
    namespace_opted_in: bool = False  # as if the namespace were labelled dynamiccl.io/tune=true


def injection_for(job_name: str, job_kind: str, settings: Settings) -> mutate.Injection:
    """The mutation inputs for one job (the webhook builds the same from the ConfigMap)."""
    knobs = configmap.env_knobs(settings.policy) if settings.policy is not None else {}
    return mutate.Injection(
        job_name=job_name,
        job_kind=job_kind,
        config_map=configmap.object_name(job_name),
        image=settings.image,
        env_knobs=knobs,
        ingest_url=settings.ingest_url,
    )


def not_tuned(doc: Mapping[str, Any], settings: Settings) -> str | None:
    """Why the operator would leave this job (or pod) untuned, so the webhook injects nothing;
    None when it opted in with valid annotations (`reconcile.wants_tuning`'s rule)."""
    parsed = job_annotations.parse((doc.get("metadata") or {}).get("annotations") or {})
    if parsed.errors:
        return "malformed annotations, runs untuned: " + "; ".join(str(e) for e in parsed.errors)
    labels = {c.LABEL_NAMESPACE_TUNE: "true"} if settings.namespace_opted_in else {}
    if not job_annotations.opted_in(parsed, labels):
        return (
            f'not opted in: annotate it {c.ANNOTATION_TUNE}: "true", or pass '
            "--namespace-opted-in if its namespace is labelled "
            f"{c.LABEL_NAMESPACE_TUNE}=true"
        )
    return None


def _set(obj: Any, path: jobkinds.Path, value: Any) -> None:
    cur = obj
    for part in path[:-1]:
        cur = cur[part]
    cur[path[-1]] = value


def inject(doc: Mapping[str, Any], settings: Settings) -> tuple[dict[str, Any], list[str]]:
    """One manifest document mutated; plus notes (why something was left alone)."""
    out = copy.deepcopy(dict(doc))
    kind = doc.get("kind")
    name = str((doc.get("metadata") or {}).get("name", ""))
    is_pod = kind == "Pod" and str(doc.get("apiVersion", "v1")) == "v1"
    if is_pod or jobkinds.kind_of(doc) is not None:
        why = not_tuned(doc, settings)
        if why is not None:
            return out, [f"{kind} {name}: {why}; left alone"]
    if is_pod:
        if not jobkinds.trains(doc):
            return out, [f"Pod {name}: an MPI launcher runs no NCCL ranks; left alone"]
        job = jobkinds.job_name_of_pod(doc) or name
        return mutate.mutate_pod(doc, injection_for(job, "Pod", settings)), []
    job_kind = jobkinds.kind_of(doc)
    if job_kind is None:
        return out, [f"{kind} {name}: not a Pod or a watched training job; left alone"]
    notes: list[str] = []
    for group in jobkinds.replica_groups(doc):
        if group.template is None:
            notes.append(
                f"{kind} {name}: no pod template in the object (pods come from its "
                "training runtime); the webhook mutates them at creation"
            )
            continue
        if not group.trains:
            notes.append(f"{kind} {name}: {group.role} runs no NCCL ranks; left alone")
            continue
        inj = injection_for(name, job_kind.value, settings)
        _set(out, group.path, mutate.mutate_pod(group.template, inj))
    return out, notes

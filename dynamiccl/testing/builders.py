"""PyTorchJobs and their pods as tests, benchmarks and tools write them: one set of builders.

The shapes are the Kubeflow training operator's (`kubeflow.org/v1` PyTorchJob: a Master
replica and optional Workers, each with a pod template; the pods it creates carry the job's
name and replica type as labels and the job as their controlling owner). Every field a
builder does not set is left out, as a user's manifest would.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dynamiccl import constants as c

IMAGE: Final = "example.invalid/train:1"
API_VERSION: Final = "kubeflow.org/v1"
KIND: Final = "PyTorchJob"

Env = Mapping[str, str] | Sequence[Mapping[str, Any]]


def container(
    name: str = "pytorch",
    *,
    gpus: int = 8,
    image: str = IMAGE,
    env: Env | None = None,
    command: Sequence[str] | None = None,
    requests: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A training container asking for ``gpus`` GPUs (none: no resources); ``env`` as a
    name -> value map or as Kubernetes env items (``valueFrom`` ones included)."""
    ct: dict[str, Any] = {"name": name, "image": image}
    if command is not None:
        ct["command"] = list(command)
    resources: dict[str, Any] = {}
    if gpus:
        resources["limits"] = {c.RESOURCE_GPU: str(gpus)}
    if requests:
        resources["requests"] = dict(requests)
    if resources or gpus:
        ct["resources"] = resources
    if env:
        items = (
            [{"name": k, "value": v} for k, v in env.items()]
            if isinstance(env, Mapping)
            else [dict(e) for e in env]
        )
        ct["env"] = items
    return ct


def template(
    *containers: dict[str, Any],
    labels: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    service_account: str | None = None,
) -> dict[str, Any]:
    """A pod template holding ``containers`` (one default training container if none)."""
    spec: dict[str, Any] = {"containers": list(containers) or [container()]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    out: dict[str, Any] = {"spec": spec}
    if labels:
        out["metadata"] = {"labels": dict(labels)}
    return out


def pytorchjob(
    name: str,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    workers: int = 1,
    pod: Mapping[str, Any] | None = None,
    master_pod: Mapping[str, Any] | None = None,
    master: bool = True,
    nproc_per_node: str | None = "auto",
    restart_policy: str | None = None,
    suspend: bool = False,
) -> dict[str, Any]:
    """A PyTorchJob: one Master (none without ``master``) and ``workers`` Workers (0: none)
    of the pod template ``pod`` (default: `template()`, 8 GPUs; the Master's: ``master_pod``
    if given)."""
    tmpl = pod if pod is not None else template()

    def replica(n: int, tmpl: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"replicas": n}
        if restart_policy is not None:
            out["restartPolicy"] = restart_policy
        out["template"] = copy.deepcopy(dict(tmpl))
        return out

    specs: dict[str, Any] = {}
    if master:
        specs["Master"] = replica(1, master_pod if master_pod is not None else tmpl)
    if workers:
        specs["Worker"] = replica(workers, tmpl)
    spec: dict[str, Any] = {}
    if nproc_per_node is not None:
        spec["nprocPerNode"] = nproc_per_node
    if suspend:  # the training operator creates no pods for it
        spec["runPolicy"] = {"suspend": True}
    spec["pytorchReplicaSpecs"] = specs
    meta: dict[str, Any] = {"name": name}
    for key, value in (("namespace", namespace), ("uid", uid)):
        if value is not None:
            meta[key] = value
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


def pod_of(
    job: Mapping[str, Any],
    index: int,
    node: str | None = None,
    replica: str = "Worker",
    uid: str | None = None,
) -> dict[str, Any]:
    """Pod ``index`` of a replica of the job as the training operator creates it (its
    template, the job's labels and controlling owner reference), bound to ``node`` if given,
    with the ``uid`` the API server gave it if given."""
    meta = job["metadata"]
    name = meta["name"]
    tmpl = copy.deepcopy(job["spec"]["pytorchReplicaSpecs"][replica]["template"])
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{replica.lower()}-{index}",
            "namespace": meta.get("namespace"),
            "labels": {
                c.LABEL_KUBEFLOW_JOB_NAME: name,
                c.LABEL_KUBEFLOW_REPLICA_TYPE: replica.lower(),
            },
            "ownerReferences": [
                {
                    "apiVersion": job.get("apiVersion", API_VERSION),
                    "kind": job.get("kind", KIND),
                    "name": name,
                    "uid": meta.get("uid"),
                    "controller": True,
                }
            ],
        },
        "spec": tmpl["spec"],
    }
    if node:
        pod["spec"]["nodeName"] = node
    if uid is not None:
        pod["metadata"]["uid"] = uid
    return pod


def pod_webhook(
    name: str,
    *,
    port: int,
    namespace: str,
    webhook: str = "pods.dynamiccl.io",
    job_names: Sequence[str] | None = None,
    reinvocation_policy: str | None = "IfNeeded",
) -> dict[str, Any]:
    """A MutatingWebhookConfiguration sending the pod creations of ``namespace`` to a webhook
    served on 127.0.0.1:``port`` (/mutate): the pods of the training jobs named ``job_names``,
    or of any training job (the training operator's job-name label present). Failures are
    ignored, as the chart's configuration ignores them."""
    label: dict[str, Any] = {"key": c.LABEL_KUBEFLOW_JOB_NAME, "operator": "Exists"}
    if job_names is not None:
        label = {"key": c.LABEL_KUBEFLOW_JOB_NAME, "operator": "In", "values": list(job_names)}
    hook: dict[str, Any] = {
        "name": webhook,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "timeoutSeconds": 3,
    }
    if reinvocation_policy is not None:
        hook["reinvocationPolicy"] = reinvocation_policy
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
    hook["rules"] = [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    hook["objectSelector"] = {"matchExpressions": [label]}
    return {"metadata": {"name": name}, "webhooks": [hook]}

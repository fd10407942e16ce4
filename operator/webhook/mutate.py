"""Pure pod mutation: what the admission webhook (and ``dynamiccl inject``) adds to a pod.

- an init step copying ``libnccl-tuner-dynamiccl.so`` from our image into a shared
  emptyDir;
- a native sidecar (init container with ``restartPolicy: Always``) running
  ``dynamiccl sidecar``: non-root, read-only root filesystem, every capability
  dropped, small requests;
- volumes: the plugin emptyDir, the job's ConfigMap (optional: a missing
  ConfigMap never blocks the pod), a memory-backed emptyDir for the shared
  decision table;
- where the job's ConfigMap holds NCCL topology files: an init step copying the pod's
  node's file into the plugin emptyDir (read-only in training containers), and
  ``NCCL_TOPO_FILE`` pointing at it (operator/controller/topo_files.py);
- env on every regular container: ``NCCL_TUNER_PLUGIN``, ``NCCL_PROFILER_PLUGIN``,
  our own variables and the per-job knobs — except any name the user set:
  the user's own ``NCCL_*`` values are never overridden and are recorded as
  constraints (annotation ``dynamiccl.io/user-nccl-env``).

Idempotent: mutating an already mutated pod returns it unchanged.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.operator.controller.jobkinds import user_constraints

PREFIX: Final = "dynamiccl-"
VOL_PLUGIN: Final = PREFIX + "plugin"
VOL_CONFIG: Final = PREFIX + "config"
VOL_SHM: Final = PREFIX + "shm"
VOL_TOKEN: Final = PREFIX + "token"
TOKEN_DIR: Final = "/var/run/secrets/dynamiccl"
TOKEN_SECONDS: Final = 3600
INIT_INSTALL: Final = PREFIX + "install-plugin"
INIT_TOPO_FILE: Final = PREFIX + "topo-file"
SIDECAR: Final = PREFIX + "sidecar"
PLUGIN_DIR: Final = "/opt/dynamiccl-plugin"
IMAGE_PLUGIN_PATH: Final = "/opt/dynamiccl/lib/" + c.PLUGIN_LIBRARY
CONFIG_DIR: Final = "/etc/dynamiccl"
SHM_DIR: Final = "/var/run/dynamiccl"
TOPO_FILE: Final = f"{PLUGIN_DIR}/nccl-topo.xml"  # written by INIT_TOPO_FILE, NCCL_TOPO_FILE
SHM_FILE: Final = f"{SHM_DIR}/{c.SHM_FILE_NAME}"  # the plugin opens this file (not the directory)
NON_ROOT_UID: Final = 65532
INGEST_CA_KEY: Final = "ingest-ca.crt"  # key of the job ConfigMap holding the ingest CA
# What the apiserver's ServiceAccount admission plugin adds to every container of a pod
# that automounts its token (it runs before webhooks, and again after a webhook mutated).
SA_VOLUME_PREFIX: Final = "kube-api-access-"
SA_TOKEN_PATH: Final = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class Injection:
    """Inputs of one mutation (from the job's ConfigMap and the operator's settings)."""

    job_name: str
    job_kind: str
    config_map: str
    image: str
    env_knobs: Mapping[str, str] = field(default_factory=dict)
    image_pull_policy: str = "IfNotPresent"
    shm_size: str = "64Mi"
    requests: Mapping[str, str] = field(default_factory=lambda: {"cpu": "50m", "memory": "64Mi"})
    limits: Mapping[str, str] = field(default_factory=lambda: {"memory": "256Mi"})
    config_digest: str = ""
    ingest_url: str = ""  # reward ingest endpoint of the operator ("" = none configured)
    topo_file: bool = False  # the job's ConfigMap holds NCCL topology files


def _security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _resources(inj: Injection) -> dict[str, Any]:
    return {"requests": dict(inj.requests), "limits": dict(inj.limits)}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def plugin_env(inj: Injection) -> list[dict[str, Any]]:
    """The env every training container gets (before removing the user's own names)."""
    lib = f"{PLUGIN_DIR}/{c.PLUGIN_LIBRARY}"
    env: list[dict[str, Any]] = [
        {"name": c.ENV_NCCL_TUNER_PLUGIN, "value": lib},
        {"name": c.ENV_NCCL_PROFILER_PLUGIN, "value": lib},
        {"name": c.ENV_SHM_PATH, "value": SHM_FILE},
        {"name": c.ENV_JOB_ID, "value": f"{inj.job_kind}/{inj.job_name}"},
    ]
    if inj.topo_file:
        env.append({"name": c.ENV_NCCL_TOPO_FILE, "value": TOPO_FILE})
    env += [{"name": k, "value": v} for k, v in sorted(inj.env_knobs.items())]
    return env


def _install_container(inj: Injection) -> dict[str, Any]:
    return {
        "name": INIT_INSTALL,
        "image": inj.image,
        "imagePullPolicy": inj.image_pull_policy,
        "command": ["cp", IMAGE_PLUGIN_PATH, PLUGIN_DIR + "/"],
        "volumeMounts": [{"name": VOL_PLUGIN, "mountPath": PLUGIN_DIR}],
        "resources": _resources(inj),
        "securityContext": _security_context(),
    }


def _topo_file_container(inj: Injection) -> dict[str, Any]:
    """Copies the pod's node's topology file (sidecar/topo_file.py); never fails the pod."""
    return {
        "name": INIT_TOPO_FILE,
        "image": inj.image,
        "imagePullPolicy": inj.image_pull_policy,
        "command": ["dynamiccl", "topo-file", "--config-dir", CONFIG_DIR, "--out", TOPO_FILE],
        "env": [_field_env(c.ENV_NODE_NAME, "spec.nodeName")],
        "volumeMounts": [
            {"name": VOL_CONFIG, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": VOL_PLUGIN, "mountPath": PLUGIN_DIR},
        ],
        "resources": _resources(inj),
        "securityContext": _security_context(),
    }


def _sidecar(inj: Injection) -> dict[str, Any]:
    return {
        "name": SIDECAR,
        "image": inj.image,
        "imagePullPolicy": inj.image_pull_policy,
        "restartPolicy": "Always",
        "command": ["dynamiccl", "sidecar"],
        "env": [
            {"name": c.ENV_CONFIG_DIR, "value": CONFIG_DIR},
            {"name": c.ENV_SHM_PATH, "value": SHM_FILE},
            {"name": c.ENV_JOB_ID, "value": f"{inj.job_kind}/{inj.job_name}"},
            _field_env(c.ENV_POD_NAME, "metadata.name"),
            _field_env(c.ENV_POD_UID, "metadata.uid"),
            _field_env(c.ENV_POD_NAMESPACE, "metadata.namespace"),
            _field_env(c.ENV_AGENT_NODE_NAME, "spec.nodeName"),
            {"name": c.ENV_INGEST_URL, "value": inj.ingest_url},
            {"name": c.ENV_INGEST_TOKEN_FILE, "value": f"{TOKEN_DIR}/token"},
            {"name": c.ENV_INGEST_CA_FILE, "value": f"{CONFIG_DIR}/{INGEST_CA_KEY}"},
        ],
        "volumeMounts": [
            {"name": VOL_CONFIG, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": VOL_SHM, "mountPath": SHM_DIR},
            {"name": VOL_TOKEN, "mountPath": TOKEN_DIR, "readOnly": True},
        ],
        "resources": _resources(inj),
        "securityContext": _security_context(),
    }


def _volumes(inj: Injection) -> list[dict[str, Any]]:
    return [
        {"name": VOL_PLUGIN, "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": VOL_CONFIG, "configMap": {"name": inj.config_map, "optional": True}},
        {"name": VOL_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": inj.shm_size}},
        {
            "name": VOL_TOKEN,
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": c.INGEST_AUDIENCE,
                            "expirationSeconds": TOKEN_SECONDS,
                            "path": "token",
                        }
                    }
                ]
            },
        },
    ]


def _add_named(items: list[dict[str, Any]], new: list[dict[str, Any]], *, front: bool) -> None:
    have = {i.get("name") for i in items}
    missing = [n for n in new if n["name"] not in have]
    if front:
        items[0:0] = missing
    else:
        items.extend(missing)


def _service_account_mount(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The API-token mount the ServiceAccount admission plugin gives new containers, if any.

    The plugin already ran when the webhook sees the pod: its ``kube-api-access-*``
    volume is there exactly when the token is automounted.
    """
    for vol in spec.get("volumes") or []:
        name = str(vol.get("name", ""))
        if name.startswith(SA_VOLUME_PREFIX):
            return {"name": name, "readOnly": True, "mountPath": SA_TOKEN_PATH}
    return None


def mutate_pod_spec(pod_spec: Mapping[str, Any], inj: Injection) -> dict[str, Any]:
    """A mutated copy of a PodSpec (the input is not modified)."""
    spec = copy.deepcopy(dict(pod_spec))
    sa_mount = _service_account_mount(spec)
    ours = [_install_container(inj)]
    ours += [_topo_file_container(inj)] if inj.topo_file else []
    ours.append(_sidecar(inj))
    if sa_mount is not None:
        # Pre-apply what the ServiceAccount plugin would add to our containers after this
        # mutation: it then changes nothing, and the apiserver does not call the webhook a
        # second time (reinvocationPolicy IfNeeded) — one round trip per pod instead of two.
        for ct in ours:
            ct["volumeMounts"].append(dict(sa_mount))
    _add_named(spec.setdefault("volumes", []), _volumes(inj), front=False)
    _add_named(spec.setdefault("initContainers", []), ours, front=True)
    env = plugin_env(inj)
    for ct in spec.get("containers") or []:
        existing = ct.setdefault("env", [])
        taken = {e.get("name") for e in existing}
        existing.extend(copy.deepcopy(e) for e in env if e["name"] not in taken)
        mounts = ct.setdefault("volumeMounts", [])
        mounted = {m.get("name") for m in mounts}
        paths = {m.get("mountPath") for m in mounts}
        for m in (
            {"name": VOL_PLUGIN, "mountPath": PLUGIN_DIR, "readOnly": True},
            {"name": VOL_SHM, "mountPath": SHM_DIR},
        ):
            if m["name"] not in mounted and m["mountPath"] not in paths:
                mounts.append(m)
    return spec


def is_injected(obj: Mapping[str, Any]) -> bool:
    """Does this pod (or pod template) already carry our sidecar?"""
    spec = obj.get("spec") or {}
    return any(ct.get("name") == SIDECAR for ct in spec.get("initContainers") or [])


def mutate_pod(pod: Mapping[str, Any], inj: Injection) -> dict[str, Any]:
    """A mutated copy of a Pod or PodTemplateSpec (``metadata`` + ``spec``).

    A pod that already carries our sidecar is returned unchanged (idempotence:
    the webhook may be called again through ``reinvocationPolicy: IfNeeded``).
    """
    if is_injected(pod):
        return copy.deepcopy(dict(pod))
    spec = pod.get("spec") or {}
    constraints = user_constraints(spec)
    # the spec is copied once, by mutate_pod_spec; the rest here
    out = {k: copy.deepcopy(v) for k, v in pod.items() if k != "spec"}
    out["spec"] = mutate_pod_spec(spec, inj)
    meta = out.setdefault("metadata", {})
    ann = meta.setdefault("annotations", {})
    ann.setdefault(c.ANNOTATION_INJECTED, inj.config_digest or "true")
    if constraints:
        ann.setdefault(c.ANNOTATION_USER_NCCL_ENV, json.dumps(constraints, sort_keys=True))
    return out

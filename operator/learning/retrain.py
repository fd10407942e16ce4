"""Retraining: when to start it, and the Kubernetes Job that runs it (pure builders).

Trigger (`retrain_due`): never while a retraining Job of the policy runs, never
without new experience; otherwise when the policy's cron schedule fired since
the last start, or when at least `min_new_experience` rows arrived since the
last trained model's experience cursor (0 disables that rule).

Job (`build_retrain_job`): `dynamiccl train --from-store URL --out DIR ...` in
the operator's own image, owned by the NCCLTuningPolicy (deleted with it),
with the experience volume mounted (SQLite lives there; the model and its
`manifest.json` are written there for the operator to register). Non-root,
read-only root filesystem, no privilege escalation, all capabilities dropped.
Placement: the node selector and tolerations the deployment gives it (the chart's
`learning.nodeSelector` / `learning.tolerations`, by default the ingest's: with
SQLite on a ReadWriteOnce volume the Job must follow the ingest onto its node,
tainted or not) and, for that volume, required pod affinity to the ingest's pod.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.cron import fired_since
from dynamiccl.api.store_secrets import carries_secret

COMPONENT_LABEL: Final = f"{c.GROUP}/component"
POLICY_LABEL: Final = f"{c.GROUP}/policy-name"
MODEL_VERSION_LABEL: Final = f"{c.GROUP}/model-version"
RETRAIN_COMPONENT: Final = "retrain"
MAX_NAME: Final = 63


@dataclass(frozen=True)
class RetrainDecision:
    """Whether to start a retraining Job now, and why (for Events / status)."""

    due: bool
    reason: str


def retrain_due(
    *,
    now_unix_s: float,
    schedule: str | None,
    min_new_experience: int,
    new_rows: int,
    last_started_unix_s: float | None,
    policy_created_unix_s: float,
    running: bool,
) -> RetrainDecision:
    """The trigger rule (see the module docstring)."""
    if running:
        return RetrainDecision(False, "a retraining Job is still running")
    if new_rows <= 0:
        return RetrainDecision(False, "no new experience since the last training")
    if min_new_experience > 0 and new_rows >= min_new_experience:
        return RetrainDecision(
            True, f"{new_rows} new experience rows (threshold {min_new_experience})"
        )
    if schedule:
        since = last_started_unix_s if last_started_unix_s is not None else policy_created_unix_s
        if fired_since(schedule, since, now_unix_s):
            return RetrainDecision(True, f"schedule {schedule!r} fired ({new_rows} new rows)")
    return RetrainDecision(
        False, f"{new_rows} new rows, waiting for {min_new_experience} or the schedule"
    )


def model_version_name(policy: str, now: dt.datetime) -> str:
    """A fresh model version: `<policy>-<UTC timestamp>` (fits the CRD's pattern, ≤ 63)."""
    base = re.sub(r"[^a-z0-9.-]", "-", policy.lower()).strip("-.") or "policy"
    return f"{base[:40]}-{now.astimezone(dt.UTC):%Y%m%d%H%M%S}"


def _job_name(policy: str, version: str) -> str:
    name = f"dynamiccl-train-{version}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(f"{policy}/{version}".encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11].rstrip('-.')}-{digest}"


@dataclass(frozen=True)
class RetrainSpec:
    """Everything the retraining Job needs."""

    policy_name: str
    policy_uid: str
    namespace: str  # the operator's namespace (where the PVC lives)
    image: str
    store_url: str
    new_version: str
    parent_version: str | None
    pvc_name: str
    # A Secret (key `url`) holding the store URL: the Job reads it from there and its
    # spec never carries the URL (a PostgreSQL password); `store_url` is then unused.
    store_url_secret: str | None = None
    mount_path: str = "/var/lib/dynamiccl"
    models_subdir: str = "models"
    service_account: str = "dynamiccl-train"
    config_path: str | None = None  # `--config FILE` (e.g. a mounted ConfigMap)
    extra_args: Sequence[str] = ()
    cpu: str = "2"
    memory: str = "4Gi"
    # Where the pod may run: a node selector and tolerations (e.g. those of the ingest,
    # whose node the Job must share when SQLite sits on a ReadWriteOnce volume).
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    active_deadline_s: int = 3600
    ttl_after_finished_s: int = 86_400
    image_pull_policy: str = "IfNotPresent"
    labels: Mapping[str, str] = field(default_factory=dict)
    # Labels of the operator's pod: with SQLite on a ReadWriteOnce volume the Job
    # must run on the operator's node to mount it (required pod affinity).
    colocate_with: Mapping[str, str] | None = None

    @property
    def out_dir(self) -> str:
        """Where the run writes `model.pt` + `manifest.json` (on the mounted volume)."""
        return f"{self.mount_path.rstrip('/')}/{self.models_subdir}/{self.new_version}"


def _placement(spec: RetrainSpec) -> dict[str, Any]:
    """nodeSelector, tolerations and (colocated) pod affinity: only the fields that are set."""
    out: dict[str, Any] = {}
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.colocate_with:
        term = {
            "labelSelector": {"matchLabels": dict(spec.colocate_with)},
            "namespaces": [spec.namespace],
            "topologyKey": c.NODE_LABEL_HOSTNAME,
        }
        required = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        out["affinity"] = {"podAffinity": required}
    return out


class StoreSecretRequired(ValueError):  # noqa: N818 - names what the deployment lacks
    """The store URL carries a password (or another secret) but no Secret was named."""


def _store_env(spec: RetrainSpec) -> dict[str, Any]:
    """The store URL reaches the Job only as an env var: from the Secret, or (no password
    in it) as a value. A URL with a password is never written into the Job's spec."""
    if spec.store_url_secret:
        ref = {"name": spec.store_url_secret, "key": "url"}
        return {"name": c.ENV_STORE_URL, "valueFrom": {"secretKeyRef": ref}}
    if carries_secret(spec.store_url):
        raise StoreSecretRequired(
            "the store URL carries a password or another secret: pass it in a Secret "
            "(chart store.urlSecret, ingest --loop-store-secret), never in the Job's spec"
        )
    return {"name": c.ENV_STORE_URL, "value": spec.store_url}


def train_args(spec: RetrainSpec) -> list[str]:
    """The container's command line: never the store URL itself (argv is world-readable in
    /proc), only the name of the env var that holds it."""
    args = ["dynamiccl", "train", "--from-store-env", c.ENV_STORE_URL, "--out", spec.out_dir]
    args += ["--version", spec.new_version]
    if spec.parent_version:
        args += ["--parent", spec.parent_version]
    if spec.config_path:
        args += ["--config", spec.config_path]
    return [*args, *spec.extra_args, "--json"]


def build_retrain_job(spec: RetrainSpec) -> dict[str, Any]:
    """The batch/v1 Job manifest (a plain dict, ready for the API)."""
    labels = {
        **spec.labels,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        COMPONENT_LABEL: RETRAIN_COMPONENT,
        POLICY_LABEL: spec.policy_name[:63],
        MODEL_VERSION_LABEL: spec.new_version,
    }
    container = {
        "name": "train",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": train_args(spec),
        "env": [
            _store_env(spec),
            {"name": "OMP_NUM_THREADS", "value": spec.cpu if spec.cpu.isdigit() else "2"},
            {"name": "HOME", "value": "/tmp"},
        ],
        "resources": {
            "requests": {"cpu": spec.cpu, "memory": spec.memory},
            "limits": {"memory": spec.memory},
        },
        "volumeMounts": [
            {"name": "experience", "mountPath": spec.mount_path},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": _job_name(spec.policy_name, spec.new_version),
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": {f"{c.GROUP}/parent-model-version": spec.parent_version or ""},
            "ownerReferences": [
                {
                    "apiVersion": f"{c.GROUP}/{c.API_VERSION}",
                    "kind": "NCCLTuningPolicy",
                    "name": spec.policy_name,
                    "uid": spec.policy_uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": spec.active_deadline_s,
            "ttlSecondsAfterFinished": spec.ttl_after_finished_s,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": spec.service_account,
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    **_placement(spec),
                    "volumes": [
                        {
                            "name": "experience",
                            "persistentVolumeClaim": {"claimName": spec.pvc_name},
                        },
                        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                    ],
                },
            },
        },
    }

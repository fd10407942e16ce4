"""The per-job ConfigMap: features, initial decision table, exploration settings, model.

Owned by the job (ownerReferences), so deleting the job garbage-collects it.
Its existence is what tells the admission webhook that a job's pods are to be
injected; ``env.json`` carries the per-job NCCL env knobs the webhook sets.

The table is compiled again only when what it is compiled *for* changes (the job's
features, e.g. estimated -> observed at binding; the policy's spec; the model
version): `compile_key`, kept in ``job.json``. The class's evidence (its findings
and exploration assignment, in the policy's `status.learning`) changes every few
seconds while jobs report; a running job's sidecars loaded their table when they
started, so a table recompiled from newer evidence would describe something the
job never ran (its TuningRun's `measuredCells` counted jobs that came after it).
`kept_table` hands back the table, and the cells that came from measurements,
of the job's last compile for the same key.

The initial decision table is operator/controller/job_table.py's (compiled, or
"NCCL's own choice" with the reason); its names are re-exported here for the
callers that build ConfigMaps with a `Compiler` of their own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.knob_experiment import KnobName
from dynamiccl.api.knob_ranges import KNOB_VALUES, exceeded_products
from dynamiccl.api.learning import ClassCoverage
from dynamiccl.api.tuning_policy import Mode, NCCLTuningPolicySpec
from dynamiccl.api.tuning_run import Arm
from dynamiccl.operator.controller.job_table import (
    MAX_TABLE_JSON,
    SHIPPED_MODEL_VERSION,
    TABLE_FORMAT,
    Compiled,
    Compiler,
    ModelUnavailable,
    canonical_json,
    compile_job,
    digest,
    fit_table,
    initial_table,
    model_unavailable,
    shipped_compiler,
    warm_up,
)
from dynamiccl.operator.controller.topo_files import NO_FILES, TopoData

__all__ = [
    "KEY_ENV",
    "KEY_EXPLORATION",
    "KEY_FEATURES",
    "KEY_INGEST_CA",
    "KEY_JOB",
    "KEY_TABLE",
    "MAX_TABLE_JSON",
    "SHIPPED_MODEL_VERSION",
    "TABLE_FORMAT",
    "Compiled",
    "Compiler",
    "JobRef",
    "ModelUnavailable",
    "build",
    "canonical_json",
    "compile_job",
    "compile_key",
    "digest",
    "env_knobs",
    "fit_table",
    "initial_table",
    "is_of_job",
    "kept_table",
    "labels",
    "model_unavailable",
    "object_name",
    "read_env",
    "read_model",
    "read_previous_env",
    "shipped_compiler",
    "valid_knob",
    "warm_up",
]

KEY_FEATURES: Final = "features.json"
KEY_TABLE: Final = "table.json"
KEY_EXPLORATION: Final = "exploration.json"
KEY_JOB: Final = "job.json"
KEY_ENV: Final = "env.json"
KEY_INGEST_CA: Final = "ingest-ca.crt"  # mutate.INGEST_CA_KEY
MAX_NAME: Final = 253


def _short(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[: limit - 9].rstrip('-.')}-{digest}"


def object_name(job_name: str) -> str:
    """Name of the job's ConfigMap and TuningRun (deterministic: the webhook derives it).

    Always ends in ``-dynamiccl`` (a long job name is shortened with a digest before it):
    the chart's admission policy ``<release>-job-config`` selects the ConfigMap by it."""
    full = f"{job_name}-dynamiccl"
    if len(full) <= MAX_NAME:
        return full
    return f"{_short(job_name, MAX_NAME - len('-dynamiccl'))}-dynamiccl"


def env_knobs(policy: NCCLTuningPolicySpec) -> dict[str, str]:
    """Per-job NCCL env knobs the policy sets at launch (its declared defaults)."""
    if policy.mode not in (Mode.STATIC, Mode.LEARNED):
        return {}
    return {
        k.name.value: str(k.default) for k in policy.constraints.env_knobs if k.default is not None
    }


@dataclass(frozen=True)
class JobRef:
    """The owning job."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        """ownerReferences entry (not a controller ref, never blocks the job's deletion)."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }


def labels(job: JobRef, component: str) -> dict[str, str]:
    """Labels of every object we create for a job."""
    return {
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_PART_OF: c.MANAGED_BY,
        c.LABEL_COMPONENT: component,
        c.LABEL_JOB_NAME: _short(job.name, 63),
        c.LABEL_JOB_KIND: job.kind.lower(),
    }


def build(
    job: JobRef,
    features: StateFeatures,
    policy_name: str,
    policy: NCCLTuningPolicySpec,
    *,
    model_version: str,
    canary: bool,
    user_constraints: Mapping[str, str] | None = None,
    ingest_ca: str = "",
    compiler: Compiler | None = None,
    env: Mapping[str, str] | None = None,
    coverage: ClassCoverage | None = None,
    topo_data: TopoData | None = None,
    kept: Compiled | None = None,
    baseline_version: str | None = None,
) -> dict[str, Any]:
    """The ConfigMap object for a tuned job (``ingest_ca``: PEM the sidecar trusts for ingest;
    ``env``: the job's knob values, by default the policy's declared ones; ``coverage``: what
    measurements of the job's hardware class settled, for its exploration assignment;
    ``topo_data``: the cluster's NCCL topology files, operator/controller/topo_files.py;
    ``kept``: the compiled table and its record (`kept_table`'s answer, or a compile the caller
    made), instead of compiling one here; ``baseline_version``: a canary job's promoted
    version, whose choices its table explores where the two differ (`compile_job`))."""
    if kept is None:
        kept = compile_job(
            features, policy, model_version, compiler, coverage=coverage, job_uid=job.uid,
            baseline_version=baseline_version,
        )  # fmt: skip
    table = kept.table
    table_digest = digest(table)
    exploration = {
        "mode": policy.mode.value,
        "policy": policy_name,
        "exploration": policy.exploration.model_dump(mode="json"),
        "guardrails": policy.guardrails.model_dump(mode="json"),
        "constraints": policy.constraints.model_dump(mode="json"),
        "user_constraints": dict(sorted((user_constraints or {}).items())),
    }
    meta = {
        "namespace": job.namespace,
        "name": job.name,
        "kind": job.kind,
        "api_version": job.api_version,
        "uid": job.uid,
        "policy": policy_name,
        "model_version": model_version,
        "canary": canary,
        "table_digest": table_digest,
        "compile_key": compile_key(features, policy_name, policy, model_version),
        "measured_cells": list(kept.measured),
        "arms_baseline": kept.arms_baseline,
        "arms": [a.model_dump(mode="json", by_alias=True) for a in kept.arms],
    }
    data = {
        KEY_FEATURES: canonical_json(features.model_dump(mode="json")),
        KEY_TABLE: canonical_json(table),
        KEY_EXPLORATION: canonical_json(exploration),
        KEY_JOB: canonical_json(meta),
        KEY_ENV: canonical_json(dict(env) if env is not None else env_knobs(policy)),
    }
    if ingest_ca:
        data[KEY_INGEST_CA] = ingest_ca
    topo = topo_data or NO_FILES
    data.update(topo.data)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": object_name(job.name),
            "namespace": job.namespace,
            "labels": labels(job, "job-config"),
            "annotations": {
                c.ANNOTATION_JOB_KIND: job.kind,
                c.ANNOTATION_CONFIG_DIGEST: digest({**data, **topo.binary_data}),
            },
            "ownerReferences": [job.owner_reference()],
        },
        "data": data,
    }
    if topo.binary_data:
        body["binaryData"] = topo.binary_data
    return body


def _own_job_meta(config_map: Mapping[str, Any], job_uid: str) -> dict[str, Any] | None:
    """The ConfigMap's ``job.json`` when it is job `job_uid`'s (None: another job of the same
    name, e.g. a deleted one whose ConfigMap is not collected yet, or malformed)."""
    try:
        meta = json.loads((config_map.get("data") or {}).get(KEY_JOB, "{}"))
    except (TypeError, ValueError):
        return None
    if not isinstance(meta, dict) or not job_uid or meta.get("uid") != job_uid:
        return None
    return meta


def is_of_job(config_map: Mapping[str, Any], job_uid: str) -> bool:
    """Was this ConfigMap written for job `job_uid` (not for a deleted job of the same name)?"""
    return _own_job_meta(config_map, job_uid) is not None


def read_model(config_map: Mapping[str, Any], job_uid: str) -> tuple[str, bool] | None:
    """The (model version, canary) an earlier decision gave job `job_uid` (None: none, or the
    ConfigMap is of another job of the same name, or malformed: the job is assigned afresh)."""
    meta = _own_job_meta(config_map, job_uid)
    version = meta.get("model_version") if meta is not None else None
    if meta is None or not isinstance(version, str) or not version:
        return None
    return version, meta.get("canary") is True


def compile_key(
    features: StateFeatures, policy_name: str, policy: NCCLTuningPolicySpec, model_version: str
) -> str:
    """What a job's table is compiled for (module docstring): its features, its policy's name
    and spec, its model version."""
    return digest(
        [features.model_dump(mode="json"), policy_name, policy.model_dump(mode="json"),
         model_version]
    )  # fmt: skip


def kept_table(config_map: Mapping[str, Any], job_uid: str, key: str) -> Compiled | None:
    """The table (and its record: cells from measurements, arms) job `job_uid`'s ConfigMap
    holds when it was compiled for `key` (None: compiled for something else, of another job,
    a model that could not be had, or malformed: compile afresh)."""
    meta = _own_job_meta(config_map, job_uid)
    if meta is None or meta.get("compile_key") != key:
        return None
    measured = meta.get("measured_cells")
    try:
        table = json.loads((config_map.get("data") or {}).get(KEY_TABLE, ""))
        arms = tuple(Arm.model_validate(a) for a in meta.get("arms") or [])
    except (TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
    if not isinstance(measured, list) or not all(isinstance(m, str) for m in measured):
        return None
    if not isinstance(table, dict) or model_unavailable(table):
        return None
    if digest(table) != meta.get("table_digest"):
        return None
    baseline = meta.get("arms_baseline")
    return Compiled(table, tuple(measured), baseline if isinstance(baseline, str) else "", arms)


def read_previous_env(config_map: Mapping[str, Any], job_uid: str) -> dict[str, str] | None:
    """The env knobs an earlier decision gave job `job_uid` (None: the ConfigMap is of another
    job of the same name, or its identity is malformed: the job is given knobs afresh)."""
    return read_env(config_map) if is_of_job(config_map, job_uid) else None


def valid_knob(name: str, value: str) -> bool:
    """Is this a knob a policy can set (``KnobName``), at a value in NCCL's documented range
    (``KNOB_VALUES``, what the policy's validation admits), written plainly?"""
    try:
        knob = KnobName(name)
        number = int(value)
    except ValueError:
        return False
    return str(number) == value and number in KNOB_VALUES[knob]


def _within_products(env: dict[str, str]) -> dict[str, str]:
    """`env` less both knobs of a pair whose product exceeds NCCL's limit (no policy arm
    sets such a pair: the policy's validation refuses it)."""
    values = {KnobName(k): int(v) for k, v in env.items()}
    drop = {k.value for pair in exceeded_products(values) for k in pair}
    return {k: v for k, v in env.items() if k not in drop}


def read_env(config_map: Mapping[str, Any]) -> dict[str, str]:
    """The env knobs a ConfigMap carries, only those a policy could have set (anything else,
    e.g. NCCL_NET_PLUGIN, NCCL_BUFFSIZE=-1 or NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD
    over 64, is dropped; malformed → none: the pod runs untuned knobs). Only the operator
    writes the ConfigMap (the chart's admission policy ``<release>-job-config``); this
    holds even where that policy is missing."""
    raw = (config_map.get("data") or {}).get(KEY_ENV, "{}")
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    pairs = ((str(k), str(v)) for k, v in value.items())
    return _within_products({k: v for k, v in pairs if valid_knob(k, v)})

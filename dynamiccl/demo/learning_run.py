"""A harness-played cluster: jobs of one hardware class in a row, the learning loop in between.

For every job, in order:

1. the operator's decision: the model version (`policy_match.choose_model`:
   promoted, or the canary for `canaryPercent` % of jobs), the table compiled
   from that version's torch-free export (`configmap.build`, the operator's
   code: compile, then the job's exploration assignment from the policy's
   `status.learning`), the TuningRun carrying the job's features;
2. the job's calls through the real plugin beside the real sidecar
   (`harness_job.play_job`: `sidecar.runner.Runner` reading the job's
   ConfigMap, file coordination of its epochs), which posts its rewards over
   HTTPS to the real ingest (TLS, token review, group commit into the SQLite
   experience store);
3. one tick of the real learning loop (`LearningLoop.tick`): TuningRun status,
   features into the store, `status.learning`, registration, canary / promotion
   by the sequential judge, and retraining: the retraining Job's own command
   (`dynamiccl train --from-store ...` as `build_retrain_job` writes it) runs as
   a local process; then one more tick registers its model and starts its canary.

Stand-ins: the Kubernetes API is the tests' in-memory one (`dynamiccl.testing.memory_api`:
copies, merge patches, the status subresource apart, resourceVersion checks);
the retraining Job is its container command run here, with `--config` naming a
smaller held-out evaluation; token review and pod lookup are the demo's local
ones (dynamiccl/demo/auth.py); see harness_job.py for the job's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dynamiccl.api.learning import LearningStatus
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.harness_job import JobSpec, Played
from dynamiccl.operator.controller import configmap
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.kube import Patcher
from dynamiccl.operator.learning.loop import JOBS, POLICIES, LearningLoop
from dynamiccl.testing.memory_api import MemoryAPI

NS: Final = "ml"


@dataclass
class JobRow:
    """One job of the sequence, as its TuningRun and the store saw it."""

    index: int
    uid: str
    model_version: str
    canary: bool
    played: Played
    speedup: float | None = None  # NCCL-default time / measured time, exploration excluded
    explored_calls: int = 0
    cost_percent: float = 0.0
    found: list[dict[str, Any]] = field(default_factory=list)
    runs_departure: bool = False  # the job's table runs what is faster in every departed cell
    leaves_nccl: bool = False  # the job's table leaves NCCL's own pair in some cell
    table: DecisionTable | None = None  # the table the job started with
    events: list[str] = field(default_factory=list)  # what the loop did after the job


def run_retrain_job(api: Patcher, job: dict[str, Any], config: Path, log: Path) -> None:
    """The retraining Job's container command, run here (see the module docstring); its
    outcome goes into the Job's status, as the Job controller writes it."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    cmd = [str(a) for a in container["command"]]
    argv = [sys.executable, "-m", "dynamiccl.cli", *cmd[1:], "--config", str(config)]
    env = {
        **os.environ,
        **{e["name"]: e["value"] for e in container.get("env") or [] if "value" in e},
    }
    env.pop("HOME", None)  # the Job's /tmp home is its own emptyDir
    with log.open("ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False, env=env)
    status = {"succeeded": 1} if done.returncode == 0 else {"failed": 1}
    meta = job["metadata"]
    api.patch(JOBS, meta["name"], {"status": status}, meta.get("namespace"), status=True)
    if done.returncode != 0:
        raise RuntimeError(f"retraining failed ({done.returncode}); see {log}")


def table_of(config_map: Mapping[str, Any]) -> DecisionTable | None:
    doc = json.loads(config_map["data"][configmap.KEY_TABLE])
    return None if "format" in doc else DecisionTable.model_validate(doc)


def policy_object(name: str, spec: NCCLTuningPolicySpec) -> dict[str, Any]:
    return {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": name, "uid": f"{name}-uid",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }  # fmt: skip


def learning_of(api: MemoryAPI, name: str) -> LearningStatus | None:
    (policy,), _ = parse_policies([api.get(POLICIES, name)])
    return policy.learning


def tuning_run(
    job: JobSpec, policy: str, version: str, canary: bool, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The job's TuningRun as the operator writes it (`meta`: its ConfigMap's job.json, whose
    arms a canary job's record lists)."""
    arms = (meta or {}).get("arms") or []
    return {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "TuningRun",
        "metadata": {"name": configmap.object_name(job.name), "namespace": job.namespace},
        "spec": {
            "jobRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job.name,
                       "namespace": job.namespace, "uid": job.uid},
            "policyName": policy, "mode": "learned", "modelVersion": version, "canary": canary,
            "features": job.features.model_dump(mode="json"),
            **({"armsBaseline": (meta or {}).get("arms_baseline"), "arms": arms} if arms else {}),
        },
    }  # fmt: skip


def pod_of(job: JobSpec) -> dict[str, Any]:
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job.name,
             "uid": job.uid, "controller": True}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": job.pod_name, "namespace": job.namespace, "uid": job.pod_uid,
                     "ownerReferences": [owner]},
        "spec": {"serviceAccountName": "default"},
    }  # fmt: skip


def launched_jobs(loop: LearningLoop) -> list[dict[str, Any]]:
    return [j for j in loop.api.list(JOBS) if not (j.get("status") or {})]

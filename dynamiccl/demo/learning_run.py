"""A harness-played cluster: jobs of one hardware class in a row, the learning loop in between.

For every job, in order:

1. the operator's decision, with `reconcile._tuned`'s calls: the model version
   (`policy_match.choose_model`: promoted, or the canary for `canaryPercent` % of
   jobs), the job's table (`configmap.compile_job`: that version's torch-free
   export compiled, the job's exploration assignment and the class's findings
   from the policy's `status.learning`, a canary's arms), its ConfigMap
   (`configmap.build`) and TuningRun (`tuningrun.build`);
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
from pathlib import Path
from typing import Any, Final

from dynamiccl.api.learning import LearningStatus
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.harness_job import JobSpec
from dynamiccl.operator.controller import configmap
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.kube import Patcher
from dynamiccl.operator.learning.loop import JOBS, POLICIES, LearningLoop
from dynamiccl.testing.memory_api import MemoryAPI

NS: Final = "ml"


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

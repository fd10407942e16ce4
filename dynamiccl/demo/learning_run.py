"""The learning half of a cluster, run here, for the harness-played jobs of `dynamiccl demo`.

`LocalLoop` holds the real pieces a cluster's operator runs for learning: the
reward ingest over HTTPS into the SQLite experience store
(`dynamiccl.testing.local_ingest`), the model registry in that store with the
shipped model registered and promoted as `default`, the operator's table compiler
(`operator_compiler`), and the learning loop (`LearningLoop.tick`: TuningRun
status, job features into the store, `status.learning`, registration, canary and
promotion, retraining Jobs).

Stand-ins, one each: the Kubernetes API is the tests' in-memory one
(`dynamiccl.testing.memory_api`); the retraining Job is its container command
run here as a process (`run_retrain_job`, with `--config` naming a smaller
held-out evaluation), its outcome written into the Job's status as the Job
controller would; token review and pod lookup are the local ones of
`dynamiccl.testing.auth`; the operator's fetch of a version's numpy export is the ingest's
model route's own read called in-process (`serve_fetch`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from dynamiccl.api.learning import LearningStatus
from dynamiccl.api.registry import file_sha256
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller import configmap
from dynamiccl.operator.controller.job_table import shipped_compiler
from dynamiccl.operator.controller.model_fetch import (
    Fetch,
    Fetched,
    FetchError,
    RegistryCompiler,
)
from dynamiccl.operator.controller.policy_match import Policy, parse_policies
from dynamiccl.operator.ingest.model_serve import NPZ_SUFFIX, ExportError, read_export
from dynamiccl.operator.kube import Patcher
from dynamiccl.operator.learning.canary import RolloutStep
from dynamiccl.operator.learning.loop import JOBS, POLICIES, LearningLoop, LoopConfig
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.policy.runtime.model_file import DEFAULT_MODEL
from dynamiccl.testing.auth import TokenIssuer
from dynamiccl.testing.local_ingest import IngestService
from dynamiccl.testing.memory_api import MemoryAPI

NS: Final = "ml"
SHIPPED: Final = configmap.SHIPPED_MODEL_VERSION
DEMO_INGEST_URL: Final = "https://dynamiccl-ingest.demo.invalid"  # never dialled: `serve_fetch`


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


def serve_fetch(registry: ModelRegistry) -> Fetch:
    """`RegistryCompiler`'s fetch, answered as the ingest's model route answers the operator
    (`model_serve.read_export` of the registered version: its `model.npz`, checked against the
    registry's digest), in-process: no HTTPS, no TokenReview (a stand-in for the transport)."""

    def fetch(url: str, _token: str, _ca: str, _timeout_s: float) -> Fetched:
        version = url.rsplit("/", 1)[-1].removesuffix(NPZ_SUFFIX)
        mv = registry.get(version)
        if mv is None:
            raise FetchError("ingest answered HTTP 404: not a registered version")
        try:
            return Fetched(read_export(mv), mv.sha256)
        except ExportError as exc:
            raise FetchError(f"ingest answered HTTP {exc.status}: {exc}") from None

    return fetch


def operator_compiler(registry: ModelRegistry, work: Path) -> RegistryCompiler:
    """The operator's compiler over this registry (`default`: the packaged model's export,
    as in the operator)."""
    token = work / "operator-token"  # RegistryCompiler reads one per fetch; the stand-in ignores it
    work.mkdir(parents=True, exist_ok=True)
    token.write_text("demo")
    return RegistryCompiler(
        DEMO_INGEST_URL, token_file=token, fetch=serve_fetch(registry), shipped=shipped_compiler()
    )


class LocalLoop:
    """The ingest, store, registry, compiler and learning loop of one local cluster (see the
    module docstring). `policies` and `namespaces` are the API objects the loop reads;
    `train` the retraining's config file (`dynamiccl train --config`)."""

    def __init__(
        self,
        work: Path,
        policies: Sequence[Mapping[str, Any]],
        *,
        train: Mapping[str, Any],
    ) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.issuer = TokenIssuer(secrets.token_bytes(32))
        self.ingest = IngestService(work / "ingest", work / "store.sqlite", self.issuer)
        try:
            (work / "ca.crt").write_text(self.ingest.ca_pem)
            self.registry = ModelRegistry(self.ingest.store.backend)
            self._bootstrap()
            self.api = MemoryAPI()
            for policy in policies:
                self.api.add(POLICIES, dict(policy))
            self.loop = LearningLoop(
                self.ingest.store, self.registry, self.api,
                LoopConfig(namespace="dynamiccl-system", image="local",
                           store_url=self.ingest.store_url, pvc_name="experience",
                           mount_path=str(work), local_mount_path=str(work)),
            )  # fmt: skip
            self.train_config = work / "train.yaml"
            self.train_config.write_text(yaml.safe_dump(dict(train)))
            self.compiler = operator_compiler(self.registry, work / "operator")
            self.rollout: RolloutStep | None = None  # the newest turn's rollout step
        except BaseException:
            self.ingest.close()
            raise

    def _bootstrap(self) -> None:
        """Lay out the packaged model as the retraining Job's volume holds versions
        (`models/<version>/model.pt`) and register it as `default`, promoted."""
        dest = self.work / "models" / SHIPPED / "model.pt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DEFAULT_MODEL, dest)
        self.registry.bootstrap(SHIPPED, sha256=file_sha256(dest), uri=str(dest))

    def policies(self) -> list[Policy]:
        """The policies as the operator reads them now (`status.learning` included)."""
        policies, errors = parse_policies(self.api.list(POLICIES))
        if errors:
            raise RuntimeError("; ".join(errors))
        return policies

    def learn(self) -> list[str]:
        """One turn of the learning loop and the retraining it launches, then one more turn
        that registers its model and starts its canary; what it did."""
        events = self._tick(why=True)
        for job in launched_jobs(self.loop):
            run_retrain_job(self.api, job, self.train_config, self.work / "retrain.log")
            events += self._tick(why=False)
        return events

    def _tick(self, *, why: bool) -> list[str]:
        """One turn of the loop: its errors, the versions it registered and its rollout step
        (`why`: with the reason)."""
        rep = self.loop.tick()
        self.rollout = rep.rollout
        events = [*rep.errors, *(f"registered {v}" for v in rep.registered)]
        step = rep.rollout
        if step is not None and step.action.value != "none":
            events.append(
                f"{step.action.value} {step.version}" + (f": {step.reason}" if why else "")
            )
        return events

    def close(self) -> None:
        self.ingest.close()


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


def launched_jobs(loop: LearningLoop) -> list[dict[str, Any]]:
    return [j for j in loop.api.list(JOBS) if not (j.get("status") or {})]

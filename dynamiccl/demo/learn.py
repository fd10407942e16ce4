"""Model versions in the demo: the registry, compiling tables per version, one retraining.

The same pieces as the cluster's learning loop, on the local disk:

- the model registry (`operator/store/registry.py`) lives in the experience
  store; the shipped model is registered as version `default` and promoted
  (`bootstrap`), its file laid out as the retraining Job's volume holds model
  versions: `MODELS/<version>/model.pt`;
- tables are compiled as the operator compiles them: its `RegistryCompiler`
  (operator/controller/model_fetch.py; the numpy policy, the shipped version
  from the packaged export, any other version's `model.npz` fetched, checked
  against the registry's digest and loaded). Stand-in: its fetch is the ingest's
  model route's own read (`model_serve.read_export`) called in-process, without
  HTTPS and TokenReview (`operator_compiler`);
- retraining runs what the retraining Job runs (`dynamiccl train
  --from-store`: `policy/train/train_job.py`), a fine-tune of the parent version on
  the store's experience, conditioned on the job features the learning loop's
  features step stored from the jobs' TuningRuns, then registers the result (digest checked) as a
  candidate and starts its canary (`operator/learning/canary.py`).
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.registry import MANIFEST_FILE, ModelStatus, ModelVersion, file_sha256
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller.configmap import SHIPPED_MODEL_VERSION
from dynamiccl.operator.controller.job_table import Compiler, shipped_compiler
from dynamiccl.operator.controller.model_fetch import (
    Fetch,
    Fetched,
    FetchError,
    RegistryCompiler,
    load_npz,
)
from dynamiccl.operator.ingest.model_serve import NPZ_SUFFIX, ExportError, read_export
from dynamiccl.operator.learning import features_sync
from dynamiccl.operator.learning.canary import RolloutStep, advance_rollout
from dynamiccl.operator.learning.retrain import model_version_name
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.operator.store.registry import ModelRegistry
from dynamiccl.policy.runtime.model_file import DEFAULT_MODEL

MODEL_FILE = "model.pt"
DEMO_INGEST_URL = "https://dynamiccl-ingest.demo.invalid"  # never dialled: see `serve_fetch`


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
    """The operator's compiler over the demo's registry. The `default` version compiles from
    the packaged model's export as in the operator, unless the demo registered another file
    as `default` (`--model`): then from that file's export, read as the ingest serves it."""
    token = work / "operator-token"  # RegistryCompiler reads one per fetch; the stand-in ignores it
    work.mkdir(parents=True, exist_ok=True)
    token.write_text("demo")
    fetch = serve_fetch(registry)
    shipped: Compiler | None = None
    default = registry.get(SHIPPED_MODEL_VERSION)
    if default is not None and default.sha256 != file_sha256(DEFAULT_MODEL):
        model = load_npz(fetch(f"/{SHIPPED_MODEL_VERSION}{NPZ_SUFFIX}", "", "", 0.0).data)

        def custom(features: StateFeatures, spec: NCCLTuningPolicySpec, version: str) -> Any:
            from dynamiccl.policy.runtime.compile import compile_table  # noqa: PLC0415

            return (
                compile_table(model, features, spec) if version == SHIPPED_MODEL_VERSION else None
            )

        shipped = custom
    return RegistryCompiler(
        DEMO_INGEST_URL, token_file=token, fetch=fetch, shipped=shipped or shipped_compiler()
    )


class DemoModelError(RuntimeError):
    """A model version cannot be used (missing, or its file does not match its digest)."""


class Models:
    """The registry plus loaded policies, for one demo."""

    def __init__(self, store: ExperienceStore, store_url: str, models_dir: Path) -> None:
        self.store = store
        self.store_url = store_url
        self.dir = models_dir
        self.registry = ModelRegistry(store.backend)
        self._loaded: dict[str, Any] = {}
        self._compiler: RegistryCompiler | None = None

    def bootstrap(self, shipped: Path) -> ModelVersion:
        """Lay out and register the shipped model as `default`, promoted (with its numpy
        export beside it, as retraining leaves every version)."""
        dest = self.dir / SHIPPED_MODEL_VERSION / MODEL_FILE
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shipped, dest)
        mv = self.registry.bootstrap(SHIPPED_MODEL_VERSION, sha256=file_sha256(dest), uri=str(dest))
        # a file that is no model fails here (DemoModelError), not in the job
        self.policy(SHIPPED_MODEL_VERSION).export_npz(dest.with_suffix(NPZ_SUFFIX), mv.sha256)
        self._loaded.pop(SHIPPED_MODEL_VERSION)  # loaded for the export: checked again on use
        return mv

    def policy(self, version: str) -> Any:
        """The loaded policy of a registered version (digest checked once)."""
        if version in self._loaded:
            return self._loaded[version]
        from dynamiccl.policy.train.inference import ModelError, Policy  # noqa: PLC0415 - torch

        mv = self.registry.get(version)
        if mv is None:
            raise DemoModelError(f"model version {version!r} is not registered")
        path = Path(mv.uri)
        if file_sha256(path) != mv.sha256:
            raise DemoModelError(f"{path}: sha256 does not match the registry's {mv.sha256[:12]}…")
        try:
            self._loaded[version] = Policy.load(path)
        except ModelError as exc:
            raise DemoModelError(f"model version {version!r}: {exc}") from None
        return self._loaded[version]

    def compile(
        self, features: StateFeatures, spec: NCCLTuningPolicySpec, version: str
    ) -> Any | None:
        """The initial table of a job for `version`, compiled by the operator's compiler
        (None if the version is not registered)."""
        if self.registry.get(version) is None:
            return None
        if self._compiler is None:
            self._compiler = operator_compiler(self.registry, self.dir)
        return self._compiler(features, spec, version)

    def versions(self) -> list[ModelVersion]:
        """Registered versions, oldest first."""
        return self.registry.list()

    def retrain(
        self,
        *,
        policy_name: str,
        runs: Iterable[Mapping[str, Any]],
        fast: bool,
        seed: int = 0,
        now: dt.datetime | None = None,
    ) -> tuple[ModelVersion, dict[str, Any]]:
        """Fine-tune the promoted version on the store's experience; register the result.

        As the cluster: the learning loop's features step stores the features of the jobs'
        TuningRuns `runs` (`features_sync.record_from_runs`), and the retraining Job's
        `dynamiccl train --from-store` reads them from the store (no features file)."""
        from dynamiccl.policy.train.offline import OfflineConfig  # noqa: PLC0415 - torch
        from dynamiccl.policy.train.train import TrainConfig  # noqa: PLC0415
        from dynamiccl.policy.train.train_job import train_job  # noqa: PLC0415

        when = now or dt.datetime.now(dt.UTC)
        self.record_features(runs, when)
        promoted = self.registry.current(ModelStatus.PROMOTED)
        parent = promoted.version if promoted is not None else SHIPPED_MODEL_VERSION
        version = model_version_name(policy_name, when)
        cfg = TrainConfig(seed=seed, eval_jobs=8 if fast else 24, calls_per_job=16)
        offline = OfflineConfig(steps=60 if fast else 200)
        result = train_job(
            cfg,
            out=self.dir / version,
            from_store=self.store_url,
            version=version,
            parent=parent,
            offline=offline,
        )
        if not (self.dir / version / MANIFEST_FILE).exists():
            raise DemoModelError(f"retraining wrote no {MANIFEST_FILE} in {self.dir / version}")
        return self.registry.register_trained(self.dir / version), result

    def record_features(self, runs: Iterable[Mapping[str, Any]], now: dt.datetime) -> int:
        """The learning loop's features step on the jobs' TuningRuns; how many were new."""
        return features_sync.record_from_runs(self.store, runs, now=now.timestamp())

    def start_canary(self, percent: int) -> RolloutStep:
        """One rollout step: the newest candidate becomes the canary for `percent` % of jobs."""
        return advance_rollout(self.registry, self.store, canary_percent=percent)

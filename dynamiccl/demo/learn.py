"""Model versions in the demo: the registry, compiling tables per version, one retraining.

The same pieces as the cluster's learning loop, on the local disk:

- the model registry (`operator/store/registry.py`) lives in the experience
  store; the shipped model is registered as version `default` and promoted
  (`bootstrap`), its file laid out as the retraining Job's volume holds model
  versions: `MODELS/<version>/model.pt`;
- tables are compiled for a job with the model of the job's version
  (`dynamiccl.policy.runtime.compile.compile_table`), loaded from the registry's URI
  after checking the file's sha256 against the registered digest — this is
  the `Compiler` the operator's ConfigMap builder takes;
- retraining runs what the retraining Job runs (`dynamiccl train
  --from-store`: `policy/train/train_job.py`), a fine-tune of the parent version on
  the store's experience, then registers the result (digest checked) as a
  candidate and starts its canary (`operator/learning/canary.py`).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.registry import MANIFEST_FILE, ModelStatus, ModelVersion, file_sha256
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller.configmap import SHIPPED_MODEL_VERSION
from dynamiccl.operator.learning.canary import RolloutStep, advance_rollout
from dynamiccl.operator.learning.retrain import model_version_name
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.operator.store.registry import ModelRegistry

MODEL_FILE = "model.pt"


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

    def bootstrap(self, shipped: Path) -> ModelVersion:
        """Lay out and register the shipped model as `default`, promoted."""
        dest = self.dir / SHIPPED_MODEL_VERSION / MODEL_FILE
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shipped, dest)
        return self.registry.bootstrap(
            SHIPPED_MODEL_VERSION, sha256=file_sha256(dest), uri=str(dest)
        )

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
        """The initial table of a job for `version` (None if the version is not registered)."""
        from dynamiccl.policy.runtime.compile import compile_table  # noqa: PLC0415

        if self.registry.get(version) is None:
            return None
        return compile_table(self.policy(version), features, spec)

    def versions(self) -> list[ModelVersion]:
        """Registered versions, oldest first."""
        return self.registry.list()

    def retrain(
        self,
        *,
        policy_name: str,
        features: Mapping[str, StateFeatures],
        fast: bool,
        seed: int = 0,
        now: dt.datetime | None = None,
    ) -> tuple[ModelVersion, dict[str, Any]]:
        """Fine-tune the promoted version on the store's experience; register the result."""
        from dynamiccl.policy.train.offline import OfflineConfig  # noqa: PLC0415 - torch
        from dynamiccl.policy.train.train import TrainConfig  # noqa: PLC0415
        from dynamiccl.policy.train.train_job import train_job  # noqa: PLC0415

        promoted = self.registry.current(ModelStatus.PROMOTED)
        parent = promoted.version if promoted is not None else SHIPPED_MODEL_VERSION
        version = model_version_name(policy_name, now or dt.datetime.now(dt.UTC))
        features_file = self.dir / f"features-{version}.json"
        features_file.write_text(
            json.dumps({uid: f.model_dump(mode="json") for uid, f in features.items()})
        )
        cfg = TrainConfig(seed=seed, eval_jobs=8 if fast else 24, calls_per_job=16)
        offline = OfflineConfig(steps=60 if fast else 200)
        result = train_job(
            cfg,
            out=self.dir / version,
            from_store=self.store_url,
            features_file=features_file,
            version=version,
            parent=parent,
            offline=offline,
        )
        if not (self.dir / version / MANIFEST_FILE).exists():
            raise DemoModelError(f"retraining wrote no {MANIFEST_FILE} in {self.dir / version}")
        return self.registry.register_trained(self.dir / version), result

    def start_canary(self, percent: int) -> RolloutStep:
        """One rollout step: the newest candidate becomes the canary for `percent` % of jobs."""
        return advance_rollout(self.registry, self.store, canary_percent=percent)

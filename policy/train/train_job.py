"""What `dynamiccl train` does end to end: train or fine-tune, then write OUT.

- Without `--from-store`: the simulator curriculum (`train.run`), from scratch
  or from `--parent`.
- With `--from-store URL`: a fine-tune of the parent model (or the shipped
  default) on the store's experience (`offline.offline_update`), then the same
  held-out simulator evaluation, so a retrained version's metrics are
  comparable with its parent's.

OUT receives `model.pt`, its numpy export `model.npz` (recording the `.pt`'s
sha256; what the operator compiles tables from), `metrics.json` (final metrics
and per-stage history) and `manifest.json` (`dynamiccl.api.registry.TrainedModelManifest`: version,
file digest, parent, metrics, experience cursor) for the operator's registry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dynamiccl.api.registry import MANIFEST_FILE, MAX_METRICS, TrainedModelManifest, file_sha256
from dynamiccl.policy.train.curriculum import sample_jobs
from dynamiccl.policy.train.ensemble import train_ensemble
from dynamiccl.policy.train.inference import DEFAULT_MODEL, ModelError, Policy
from dynamiccl.policy.train.offline import (
    ExperienceError,
    OfflineConfig,
    offline_update,
    read_features,
    read_store,
)
from dynamiccl.policy.train.train import TrainConfig, evaluate, flat_metrics, label_jobs

MODEL_FILE = "model.pt"
NPZ_FILE = "model.npz"


class TrainJobError(ValueError):
    """Bad input to a training run (the message names the file or flag)."""


def _parent_model(out: Path, parent: str | None) -> Policy | None:
    if parent is None:
        return None
    path = out.parent / parent / MODEL_FILE
    try:
        return Policy.load(path)
    except ModelError as exc:
        raise TrainJobError(f"parent: {exc}") from None


def _eval_only(policy: Policy, cfg: TrainConfig) -> dict[str, float]:
    torch.manual_seed(cfg.seed)
    jobs = sample_jobs(np.random.default_rng([cfg.seed, 1]), cfg.eval_jobs, [1.0, 1.0, 1.0])
    rng = np.random.default_rng([cfg.seed, 2])
    data, sims = label_jobs(jobs, rng, cfg.calls_per_job, cfg.limits)
    return flat_metrics("eval", evaluate(policy, data, sims, cfg.limits))


def train_job(
    cfg: TrainConfig,
    *,
    out: Path,
    from_store: str | None = None,
    features_file: Path | None = None,
    version: str | None = None,
    parent: str | None = None,
    offline: OfflineConfig | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Run and write OUT; returns the manifest (as JSON-able dict) plus all metrics."""
    torch.set_num_threads(cfg.threads)
    init = _parent_model(out, parent)
    cursor = 0
    history: list[dict[str, Any]] = []
    if from_store is None:
        policy, metrics, history = train_ensemble(cfg, init=init, log=log)
    else:
        try:
            experience = read_store(from_store)
            features = read_features(features_file) if features_file else {}
        except ExperienceError as exc:
            raise TrainJobError(str(exc)) from None
        policy = init or Policy.load(DEFAULT_MODEL)
        # Every member learns from the same experience: a peer that did not would
        # veto the deviations real measurements teach the first member.
        metrics, *_ = [
            offline_update(
                Policy(net=net),
                experience,
                features,
                offline or OfflineConfig(),
                rng=np.random.default_rng([cfg.seed, 3, i] if i else [cfg.seed, 3]),
                limits=cfg.limits,
            )
            for i, net in enumerate((policy.net, *policy.peers))
        ]
        cursor = max((e.id for e in experience), default=0)
        metrics.update(_eval_only(policy, cfg))
        log(json.dumps(metrics))
        policy.meta = {
            **policy.meta,
            "seed": cfg.seed,
            "fine_tuned_from": parent or "default",
            "metrics": metrics,
        }
    out.mkdir(parents=True, exist_ok=True)
    model_path = out / MODEL_FILE
    policy.save(model_path)
    # The torch-free export the operator compiles tables from (served by the ingest process).
    policy.export_npz(out / NPZ_FILE, source_sha256=file_sha256(model_path))
    (out / "metrics.json").write_text(
        json.dumps({"metrics": metrics, "history": history}, indent=2, sort_keys=True)
    )
    name = version or f"local-seed{cfg.seed}"
    kept = dict(sorted(metrics.items())[:MAX_METRICS])
    manifest = TrainedModelManifest(
        version=name,
        model_file=MODEL_FILE,
        sha256=file_sha256(model_path),
        parent=parent,
        metrics=kept,
        experience_cursor=cursor,
    )
    (out / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2))
    return {**manifest.model_dump(mode="json"), "metrics": metrics}

"""What `dynamiccl train` does end to end: train or fine-tune, then write OUT.

- Without `--from-store`: the simulator curriculum (`train.run`), from scratch
  or from `--parent`.
- With `--from-store URL`: a fine-tune of the parent model (or the shipped
  default) on the store's experience with the features stored beside it
  (`store_data.collect`; `--features FILE` adds or overrides job features;
  rows it cannot use are counted by reason in the metrics, `offline/skipped_*`,
  never fatal), then the same
  held-out simulator evaluation, so a retrained version's metrics are
  comparable with its parent's.

OUT receives `model.pt`, its numpy export `model.npz` (recording the `.pt`'s
sha256; what the operator compiles tables from), `metrics.json` (final metrics
and per-stage history) and `manifest.json` (`dynamiccl.api.registry.TrainedModelManifest`: version,
file digest, parent, metrics, experience cursor) for the operator's registry.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dynamiccl.api.registry import MANIFEST_FILE, MAX_METRICS, TrainedModelManifest, file_sha256
from dynamiccl.api.store_secrets import redact_message, redact_store_url
from dynamiccl.policy.train.curriculum import sample_jobs
from dynamiccl.policy.train.ensemble import train_ensemble
from dynamiccl.policy.train.inference import DEFAULT_MODEL, ModelError, Policy
from dynamiccl.policy.train.offline import ExperienceError, OfflineConfig, fit, read_features
from dynamiccl.policy.train.store_data import Weighting, collect, encode
from dynamiccl.policy.train.train import TrainConfig, evaluate, flat_metrics, label_jobs

MODEL_FILE = "model.pt"
NPZ_FILE = "model.npz"


class TrainJobError(ValueError):
    """Bad input to a training run (the message names the file or flag)."""


SHIPPED_VERSION = "default"  # the model in the package (the learning loop's first parent)


def _parent_model(out: Path, parent: str | None) -> Policy | None:
    if parent is None:
        return None
    path = out.parent / parent / MODEL_FILE
    if parent == SHIPPED_VERSION and not path.exists():
        # a cluster's first retrain: the learning loop names the shipped model as the
        # parent, and nothing writes it onto the store's volume
        return None
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
        off = offline or cfg.offline
        try:
            overrides = read_features(features_file) if features_file else {}
            data = collect(
                from_store,
                overrides=overrides,
                weighting=Weighting(off.beta, off.max_weight),
            )
        except FileNotFoundError:
            raise TrainJobError(
                f"store {redact_store_url(from_store)}: no such SQLite file"
            ) from None
        except (ExperienceError, OSError, sqlite3.Error) as exc:
            raise TrainJobError(redact_message(f"store {from_store}: {exc}", from_store)) from None
        policy = init or Policy.load(DEFAULT_MODEL)
        enc = encode(data, policy, cfg.limits)
        metrics = data.stats()
        # Every member learns from the same experience: a peer that did not would veto the
        # deviations real measurements teach the first member.
        for i, net in enumerate((policy.net, *policy.peers)):
            seed = [cfg.seed, 3, i] if i else [cfg.seed, 3]
            fitted = fit(Policy(net=net), enc, off, rng=np.random.default_rng(seed))
            if i == 0:
                metrics.update(fitted)
        cursor = data.cursor
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

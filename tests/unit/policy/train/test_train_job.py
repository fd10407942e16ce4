"""`dynamiccl train` end to end: OUT holds model, metrics and a manifest the registry accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamiccl.api.registry import MANIFEST_FILE, TrainedModelManifest, file_sha256
from dynamiccl.operator.store.experience import open_store
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from dynamiccl.policy.train.imitation import ImitationConfig
from dynamiccl.policy.train.inference import DEFAULT_MODEL, Policy
from dynamiccl.policy.train.offline import OfflineConfig
from dynamiccl.policy.train.ppo import PPOConfig
from dynamiccl.policy.train.train import StageConfig, TrainConfig
from dynamiccl.policy.train.train_job import TrainJobError, train_job

TINY = TrainConfig(
    seed=1,
    hidden=16,
    calls_per_job=4,
    eval_jobs=2,
    stages=(StageConfig(dataset_jobs=2, imitation_steps=2, ppo_iterations=1),) * 3,
    imitation=ImitationConfig(batch=8),
    ppo=PPOConfig(jobs=2, steps=2, epochs=1, minibatch_jobs=2),
)


def test_writes_model_metrics_and_manifest(tmp_path: Path) -> None:
    out = tmp_path / "models" / "v1"
    doc = train_job(TINY, out=out, version="v1")
    manifest = TrainedModelManifest.model_validate_json((out / MANIFEST_FILE).read_text())
    assert manifest.version == "v1"
    assert manifest.sha256 == file_sha256(out / manifest.model_file)
    assert manifest.parent is None
    assert "eval/oracle_fraction" in manifest.metrics
    assert doc["sha256"] == manifest.sha256
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["stage"] for h in metrics["history"]] == ["node", "rack", "tier"]
    assert Policy.load(out / "model.pt").meta["seed"] == 1
    # the torch-free export next to it, recording the .pt's digest (what the operator compiles)
    exported = NumpyPolicy.load(out / "model.npz")
    assert exported.source_sha256 == manifest.sha256
    assert exported.meta["seed"] == 1

    # A child version fine-tunes its parent on the (empty) store.
    store = tmp_path / "exp.db"
    open_store(str(store)).close()
    child = tmp_path / "models" / "v2"
    doc2 = train_job(
        TINY, out=child, version="v2", parent="v1", from_store=str(store), offline=OfflineConfig()
    )
    assert doc2["parent"] == "v1"
    assert doc2["experience_cursor"] == 0
    assert doc2["metrics"]["offline/records"] == 0


def test_the_first_retrain_fine_tunes_the_shipped_model(tmp_path: Path) -> None:
    # the learning loop names "default" as the parent of a cluster's first retrain; no
    # models/default/ exists on the store's volume: the model in the package is the parent
    store = tmp_path / "exp.db"
    open_store(str(store)).close()
    out = tmp_path / "models" / "v1"
    doc = train_job(
        TINY,
        out=out,
        version="v1",
        parent="default",
        from_store=str(store),
        offline=OfflineConfig(),
    )
    assert doc["parent"] == "default"
    shipped = Policy.load(DEFAULT_MODEL)
    child = Policy.load(out / "model.pt")
    assert child.meta["config"]["hidden"] == shipped.meta["config"]["hidden"] != TINY.hidden


def test_bad_parent_and_store(tmp_path: Path) -> None:
    with pytest.raises(TrainJobError, match="parent"):
        train_job(TINY, out=tmp_path / "models" / "x", parent="nope")
    with pytest.raises(TrainJobError, match="no such SQLite file"):
        train_job(TINY, out=tmp_path / "y", from_store=str(tmp_path / "missing.db"))


def test_the_config_files_offline_settings_drive_the_fine_tune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retraining Job passes only `--config`: its `offline` block is what the fine-tune
    runs with (the demo's fast mode shortens it there), and a typo in it is refused."""
    from dynamiccl.policy.train import train_job as tj  # noqa: PLC0415
    from dynamiccl.policy.train.train import ConfigError, load_config  # noqa: PLC0415

    cfg_file = tmp_path / "train.yaml"
    cfg_file.write_text("eval_jobs: 2\noffline: {steps: 7, beta: 3.0}\n")
    cfg = load_config(cfg_file)
    seen: list[OfflineConfig] = []

    def fit(_policy: object, _enc: object, off: OfflineConfig, **_kw: object) -> dict[str, float]:
        seen.append(off)
        return {}

    monkeypatch.setattr(tj, "fit", fit)
    store = tmp_path / "exp.db"
    open_store(str(store)).close()
    train_job(cfg, out=tmp_path / "v1", version="v1", parent="default", from_store=str(store))
    assert seen
    assert {(o.steps, o.beta) for o in seen} == {(7, 3.0)}
    cfg_file.write_text("offline: {stepz: 7}\n")
    with pytest.raises(ConfigError, match=r"offline\.stepz"):
        load_config(cfg_file)

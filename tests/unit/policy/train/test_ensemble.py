"""Seed ensembles: members trained in worker processes equal members trained in-process,
the model keeps them all, and a fine-tune on real experience moves every member."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from dynamiccl.policy.train.ensemble import train_ensemble
from dynamiccl.policy.train.inference import Policy
from dynamiccl.policy.train.offline import OfflineConfig
from dynamiccl.policy.train.train import run
from dynamiccl.policy.train.train_job import train_job
from tests.unit.policy.train.test_offline import FEATURES, _store
from tests.unit.policy.train.test_train import TINY

PAIR = TINY.model_copy(update={"members": 2})


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_members_are_the_seeds_runs_wherever_they_train() -> None:
    in_process, metrics, _ = train_ensemble(PAIR)
    spawned, _, _ = train_ensemble(PAIR.model_copy(update={"workers": 2}))
    second, _, _ = run(TINY.model_copy(update={"seed": TINY.seed + 1}))
    assert len(in_process.peers) == len(spawned.peers) == 1
    assert _same(in_process.net, spawned.net)
    assert _same(in_process.peers[0], spawned.peers[0])
    assert _same(in_process.peers[0], second.net)  # member i is seed + i's own run
    assert not _same(in_process.net, in_process.peers[0])
    assert metrics["ensemble/members"] == 2
    assert "eval_deployed/below_default_2pct" in metrics
    assert [m["seed"] for m in in_process.meta["members"]] == [TINY.seed, TINY.seed + 1]
    one, metrics1, _ = train_ensemble(TINY)
    assert not one.peers
    assert "ensemble/members" not in metrics1


def test_fine_tune_moves_every_member_and_export_keeps_them(tmp_path: Path) -> None:
    models = tmp_path / "models"
    train_job(PAIR, out=models / "v1", version="v1")
    parent = Policy.load(models / "v1" / "model.pt")
    assert len(parent.peers) == 1
    assert len(NumpyPolicy.load(models / "v1" / "model.npz").peers) == 1
    features = tmp_path / "features.yaml"
    features.write_text(yaml.safe_dump({"job-a": FEATURES, "job-b": FEATURES}))
    doc = train_job(
        PAIR,
        out=models / "v2",
        version="v2",
        parent="v1",
        from_store=_store(tmp_path),
        features_file=features,
        offline=OfflineConfig(steps=5),
    )
    assert doc["metrics"]["offline/used"] > 0
    child = Policy.load(models / "v2" / "model.pt")
    assert len(child.peers) == 1
    assert not _same(child.net, parent.net)
    assert not _same(child.peers[0], parent.peers[0])  # a stale peer would veto what it learnt

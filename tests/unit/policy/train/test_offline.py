"""Offline updates from the real experience store (written by the operator's store code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.store.experience import open_store
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.train.inference import new_policy
from dynamiccl.policy.train.offline import (
    ExperienceError,
    OfflineConfig,
    offline_update,
    read_features,
    read_store,
)
from tests.topology_samples import dgx_h100

NODE: dict[str, Any] = dgx_h100("h100")
FEATURES = {
    "world_size": 16,
    "gpus_per_pod": 8,
    "replicas": 2,
    "nproc_per_node": 8,
    "topology": {**NODE, "tier_max": "same_rack", "tier_mix": {"same_rack": 1.0, "same_node": 0}},
}


def _record(algo: str, proto: str, mean: float, default: float, n: int = 1 << 20) -> dict[str, Any]:
    return {
        "collective": "allreduce",
        "size_bucket": n.bit_length() - 1,
        "nbytes_min": n,
        "nbytes_max": 2 * n - 1,
        "nranks": 16,
        "nnodes": 2,
        "algo": algo,
        "proto": proto,
        "nchannels": 0,
        "chunk_bytes": 0,
        "origin": "explore",
        "count": 100,
        "mean_time_us": mean,
        "p50_time_us": mean,
        "p99_time_us": mean * 1.2,
        "busbw_GBps": 1.0,
        "nccl_default_time_us": default,
    }


def _store(tmp_path: Path) -> str:
    url = str(tmp_path / "exp.db")
    store = open_store(url)
    for i, uid in enumerate(("job-a", "job-b")):
        batch = RewardBatch.model_validate(
            {
                "idempotency_key": f"pod-{i}/1",
                "job": {"namespace": "ns", "kind": "PyTorchJob", "name": f"j{i}", "uid": uid},
                "pod": {"name": f"p{i}", "uid": f"pod-{i}"},
                "model_version": "default",
                "table_version": 1,
                "records": [
                    # tree/simple measured 30 % faster than NCCL's default; ring/ll 2x slower
                    _record("tree", "simple", 70.0, 100.0),
                    _record("ring", "ll", 200.0, 100.0),
                ],
            }
        )
        store.insert_batch(batch)
    store.close()
    return url


def test_reads_what_the_operator_stored(tmp_path: Path) -> None:
    url = _store(tmp_path)
    rows = read_store(url)
    assert len(rows) == 4
    assert [r.job_uid for r in rows] == ["job-a", "job-a", "job-b", "job-b"]
    assert rows[0].record.algo is Algo.TREE
    assert read_store(f"sqlite:///{url}", after_id=rows[1].id) == rows[2:]
    with pytest.raises(ExperienceError, match="no such SQLite file"):
        read_store(str(tmp_path / "missing.db"))


def test_awr_moves_the_policy_towards_what_measured_faster(tmp_path: Path) -> None:
    url = _store(tmp_path)
    feats = {"job-a": StateFeatures.model_validate(FEATURES)}  # job-b has no features
    pol = new_policy(0, hidden=32)
    dec = Decider.of(pol, feats["job-a"])

    def prob(algo: Algo, proto: Proto) -> float:
        obs, feas, _ = dec.inputs(np.array([Collective.ALLREDUCE.nccl_id]), np.array([2.0**20.5]))
        lp = pol.joint_log_probs(obs, feas)[0]
        return float(np.exp(lp[algo.nccl_id, proto.nccl_id, 0, 0]))

    before_good = prob(Algo.TREE, Proto.SIMPLE)
    stats = offline_update(
        pol, read_store(url), feats, OfflineConfig(steps=150, lr=1e-3), rng=np.random.default_rng(0)
    )
    assert stats["offline/used"] == 2
    assert stats["offline/skipped_no_features"] == 2
    good, bad = prob(Algo.TREE, Proto.SIMPLE), prob(Algo.RING, Proto.LL)
    assert good > 2 * before_good
    # The configuration that measured faster becomes the policy's choice; the slow
    # one (weighted by exp(beta * log 0.5)) ends far less probable.
    assert good > 3 * bad
    obs, feas, _ = dec.inputs(np.array([Collective.ALLREDUCE.nccl_id]), np.array([2.0**20.5]))
    a = pol.greedy(obs, feas)[0]
    assert (a[0], a[1]) == (Algo.TREE.nccl_id, Proto.SIMPLE.nccl_id)


def test_features_file(tmp_path: Path) -> None:
    good = tmp_path / "f.yaml"
    good.write_text(yaml.safe_dump({"job-a": FEATURES}))
    assert read_features(good)["job-a"].world_size == 16
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"job-a": {**FEATURES, "world_size": 3}}))
    with pytest.raises(ExperienceError, match="job-a"):
        read_features(bad)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.dictionaries(st.sampled_from(list(FEATURES)), st.integers(-2, 40) | st.text(max_size=4)),
        max_size=3,
    )
    | st.lists(st.integers(), max_size=3)
    | st.text(max_size=20)
)
def test_read_features_fuzz(tmp_path: Path, doc: object) -> None:
    """Any document: a mapping of valid features or one ExperienceError naming the file."""
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    outcome: dict[str, StateFeatures] | str
    try:
        outcome = read_features(path)
    except ExperienceError as exc:
        outcome = str(exc)
    if isinstance(outcome, str):
        assert str(path) in outcome
    else:
        assert all(isinstance(v, StateFeatures) for v in outcome.values())


def test_a_batch_of_weightless_rows_leaves_the_model_finite() -> None:
    """A sampled batch whose rows all weigh 0 divided 0 by 0: the loss and every parameter
    became NaN, and the model's greedy choice collapsed to the first option of every head
    (seen: a point with one confirmed and one unconfirmed configuration, 2026-12-02)."""
    import torch  # noqa: PLC0415

    from dynamiccl.policy.train.offline import fit  # noqa: PLC0415
    from dynamiccl.policy.train.store_data import Encoded  # noqa: PLC0415

    pol = new_policy(0, hidden=32)
    dec = Decider.of(pol, StateFeatures.model_validate(FEATURES))
    obs, feas, _ = dec.inputs(np.array([Collective.ALLREDUCE.nccl_id]), np.array([2.0**20.5]))
    act = np.argwhere(feas[0])[:2]
    enc = Encoded(obs=np.repeat(obs, 2, 0), feasible=np.repeat(feas, 2, 0), actions=act,
                  weight=np.array([0.0, 0.0], dtype=np.float32))  # fmt: skip
    fit(pol, enc, OfflineConfig(steps=5, batch=2), rng=np.random.default_rng(0))
    assert all(bool(torch.isfinite(p).all()) for p in pol.net.parameters())

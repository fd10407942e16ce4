"""Model files: save/load round trip, clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dynamiccl.policy.runtime.encode import OBS_DIM, OBS_VERSION
from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS, HEADS
from dynamiccl.policy.train.inference import DEVIATE_CONFIDENCE, ModelError, Policy, new_policy


def _feasible(n: int) -> np.ndarray:
    f = np.zeros((n, *HEADS.as_tuple()), dtype=bool)
    f[:, 1, 2, :, :] = True  # ring / simple, every channel and chunk
    f[:, 0, 0, :, 0] = True  # tree / ll
    return f


def test_round_trip(tmp_path: Path) -> None:
    pol = new_policy(1, hidden=16)
    pol.meta = {"seed": 1, "metrics": {"eval/speedup": 1.0}}
    path = tmp_path / "m.pt"
    pol.save(path)
    back = Policy.load(path)
    assert back.meta["seed"] == 1
    obs = np.random.default_rng(0).random((5, OBS_DIM)).astype(np.float32)
    f = _feasible(5)
    pol.net.eval()
    assert (pol.greedy(obs, f) == back.greedy(obs, f)).all()
    lp = back.joint_log_probs(obs, f)
    assert lp.shape == (5, *HEADS.as_tuple())
    assert np.isneginf(lp[~f]).all()


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        Policy.load(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    with pytest.raises(ModelError, match="not a DynamICCL model"):
        Policy.load(junk)
    other = tmp_path / "other.pt"
    pol = new_policy(0, hidden=8)
    blob = {"config": pol.net.config(), "state": pol.net.state_dict(), "obs_version": -1}
    torch.save(blob, other)
    with pytest.raises(ModelError, match="observation layout"):
        Policy.load(other)


def _ensemble() -> Policy:
    nets = [new_policy(s, hidden=16).net for s in (1, 2, 3)]
    for n in nets:
        n.eval()
    return Policy(net=nets[0], meta={"seed": 1}, peers=tuple(nets[1:]))


def test_peers_round_trip_and_give_a_second_opinion(tmp_path: Path) -> None:
    ens = _ensemble()
    path = tmp_path / "e.pt"
    ens.save(path)
    back = Policy.load(path)
    assert len(back.peers) == 2
    for a, b in zip((ens.net, *ens.peers), (back.net, *back.peers), strict=True):
        for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert ka == kb
            assert torch.equal(va, vb)
    rng = np.random.default_rng(0)
    obs = rng.random((64, OBS_DIM)).astype(np.float32)
    f = np.ones((64, *HEADS.as_tuple()), dtype=bool)
    greedy = back.greedy(obs, f)
    alone = Policy(net=back.net)
    with torch.inference_mode():
        pairs = [
            n.pair_log_probs(Policy(net=n)._h(obs), torch.from_numpy(f)).exp().numpy()
            for n in (back.net, *back.peers)
        ]
    # NCCL's pick: the pair the first member likes least, so every greedy row leaves it.
    flat = pairs[0].reshape(64, -1).argmin(1)
    pick = np.stack([flat // pairs[0].shape[2], flat % pairs[0].shape[2]], 1).astype(np.int64)
    assert (greedy == alone.greedy(obs, f)).all()  # the first member decides
    rows = np.arange(64)
    mean = np.mean([p[rows, greedy[:, 0], greedy[:, 1]] for p in pairs], 0)
    for tau in (0.25, 0.3):
        kept1 = (alone.decide(obs, f, pick, tau=tau)[0][:, :2] != pick).any(1)
        kept3 = (back.decide(obs, f, pick, tau=tau)[0][:, :2] != pick).any(1)
        assert kept3.tolist() == (mean >= tau).tolist()  # the members' mean confidence
        assert (kept1 != kept3).any()  # untrained members disagree: it matters


def test_bad_peers(tmp_path: Path) -> None:
    ens = _ensemble()
    blob = {
        "config": ens.net.config(),
        "state": ens.net.state_dict(),
        "obs_version": OBS_VERSION,
        "channel_options": list(CHANNEL_OPTIONS),
        "chunk_options": list(CHUNK_OPTIONS),
    }
    for peers, what in (
        ("nope", "peers must be networks"),
        ([{"config": {"obs_dim": 3}, "state": {}}], "peers must be networks"),
        ([{"config": ens.peers[0].config(), "state": {}}], "weights do not fit"),
    ):
        torch.save({**blob, "peers": peers}, tmp_path / "bad.pt")
        with pytest.raises(ModelError, match=what):
            Policy.load(tmp_path / "bad.pt")


def test_a_model_decides_at_the_confidence_it_was_trained_with(tmp_path: Path) -> None:
    ens = _ensemble()
    assert ens.tau == DEVIATE_CONFIDENCE  # no training config: the default
    ens.meta = {"config": {"deviate_confidence": 0.25}}
    ens.save(tmp_path / "e.pt")
    back = Policy.load(tmp_path / "e.pt")
    assert back.tau == 0.25
    rng = np.random.default_rng(1)
    obs = rng.random((64, OBS_DIM)).astype(np.float32)
    f = np.ones((64, *HEADS.as_tuple()), dtype=bool)
    pick = np.zeros((64, 2), dtype=np.int64)
    implicit = back.decide(obs, f, pick)[0]
    assert (implicit == back.decide(obs, f, pick, 0.25)[0]).all()
    assert not (implicit == back.decide(obs, f, pick, DEVIATE_CONFIDENCE)[0]).all()

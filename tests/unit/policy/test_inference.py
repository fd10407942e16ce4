"""Model files: save/load round trip, clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dynamiccl.policy.encode import OBS_DIM
from dynamiccl.policy.inference import ModelError, Policy, new_policy
from dynamiccl.policy.space import HEADS


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

"""Training smoke test (tiny budget): runs the whole curriculum, seeded, reproducible."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamiccl.policy.train.imitation import ImitationConfig
from dynamiccl.policy.train.ppo import PPOConfig
from dynamiccl.policy.train.train import ConfigError, StageConfig, TrainConfig, load_config, run

TINY = TrainConfig(
    seed=3,
    hidden=16,
    calls_per_job=4,
    eval_jobs=3,
    stages=(StageConfig(dataset_jobs=3, imitation_steps=3, ppo_iterations=1),) * 3,
    imitation=ImitationConfig(batch=16),
    ppo=PPOConfig(jobs=2, steps=3, epochs=1, minibatch_jobs=2),
)


def test_smoke_same_seed_same_weights() -> None:
    a, metrics, history = run(TINY)
    b, _, _ = run(TINY)
    sa, sb = a.net.state_dict(), b.net.state_dict()
    for (ka, va), (kb, vb) in zip(sa.items(), sb.items(), strict=True):
        assert ka == kb
        assert torch.equal(va, vb), ka
    assert [h["stage"] for h in history] == ["node", "rack", "tier"]
    assert "eval/oracle_fraction" in metrics
    assert "train/imitation_loss" in metrics
    assert "stage/node/eval/speedup" in metrics
    prefixes = {"train", "eval", "eval_deployed", "eval_imitation", "stage"}
    assert all(k.split("/")[0] in prefixes for k in metrics)
    assert "eval_deployed/below_default_2pct" in metrics
    assert a.meta["seed"] == 3
    c, _, _ = run(TINY.model_copy(update={"seed": 4}))
    assert any(
        not torch.equal(x, y)
        for x, y in zip(a.net.state_dict().values(), c.net.state_dict().values(), strict=True)
    )


def test_load_config(tmp_path: Path) -> None:
    good = tmp_path / "c.yaml"
    good.write_text("seed: 7\nstages:\n  - {ppo_iterations: 1}\n  - {}\n  - {}\n")
    assert load_config(good).seed == 7
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: -1\n")
    with pytest.raises(ConfigError, match="seed"):
        load_config(bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("sed: 1\n")
    with pytest.raises(ConfigError, match="sed"):
        load_config(unknown)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


_YAML = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_KEYS = st.sampled_from(
    ["seed", "threads", "hidden", "stages", "imitation", "ppo", "reward", "limits"]
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(_KEYS, _YAML, max_size=4) | _YAML)
def test_load_config_fuzz(tmp_path: Path, doc: object) -> None:
    """Any YAML document: a valid config or one ConfigError, never another exception."""
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    outcome: TrainConfig | str
    try:
        outcome = load_config(path)
    except ConfigError as exc:
        outcome = str(exc)
    if isinstance(outcome, str):
        assert outcome.startswith(str(path))
    else:
        assert isinstance(outcome, TrainConfig)

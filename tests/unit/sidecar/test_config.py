"""The sidecar's configuration: the mounted ConfigMap plus the pod's environment."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamiccl.api.rewards import RewardRecord
from dynamiccl.api.tuning_policy import Mode
from dynamiccl.sidecar.config import ConfigError, load
from tests import reward_samples
from tests.unit.sidecar.conftest import JOB, ConfigDir, exploration

ENV = {"DYNAMICCL_POD_NAME": "llm-worker-0", "DYNAMICCL_POD_UID": "pod-uid-0"}


def test_a_complete_config(config_dir: ConfigDir, tmp_path: Path) -> None:
    d = config_dir()
    (d / "ingest-ca.crt").write_text("pem")
    env = ENV | {
        "DYNAMICCL_SHM_PATH": str(tmp_path),  # the emptyDir's mount point: our file inside
        "DYNAMICCL_INGEST_URL": "https://ingest:8443/v1/rewards",
    }
    cfg = load(d, env)
    assert cfg.job.uid == JOB["uid"]
    assert (cfg.pod_name, cfg.pod_uid) == ("llm-worker-0", "pod-uid-0")
    assert cfg.table is not None
    assert cfg.table.version == 1
    assert cfg.learned
    assert cfg.exploration.mode is Mode.LEARNED
    assert cfg.exploration.exploration.budget_calls == 200
    assert (cfg.voters, cfg.procs_per_pod) == (2, 4)  # from the features
    assert cfg.shm_path == tmp_path / "dynamiccl.shm"
    assert cfg.state_dir == tmp_path / "sidecar-state"
    assert cfg.ca_file == d / "ingest-ca.crt"
    assert cfg.ingest_url == "https://ingest:8443/v1/rewards"
    assert cfg.warnings == ()


def test_the_tuner_and_the_batches_come_from_the_config(config_dir: ConfigDir) -> None:
    cfg = load(config_dir(), ENV)
    tuner = cfg.tuner()
    g = cfg.exploration.guardrails
    assert tuner.guardrail.threshold == g.regression_threshold
    assert tuner.budget_calls == cfg.exploration.exploration.budget_calls
    rec = RewardRecord.model_validate(reward_samples.record(12))
    batch = cfg.batch(7, 3, [rec], [])
    assert batch.idempotency_key == "pod-uid-0/7"
    assert (batch.job.uid, batch.pod.name, batch.table_version) == (JOB["uid"], "llm-worker-0", 3)
    assert batch.model_version == JOB["model_version"]
    assert batch.records == (rec,)


def test_the_channel_variants_keep_to_the_policys_channel_constraints(
    config_dir: ConfigDir,
) -> None:
    cfg = load(config_dir(), ENV)
    assert cfg.channel_range == (1, 32)  # ChannelRange's defaults: an empty constraints block
    assert cfg.tuner().refine == 0.5
    written = exploration() | {"constraints": {"channels": {"min": 4, "max": 16}}}
    cfg = load(config_dir(exploration_json=written), ENV)
    assert cfg.channel_range == (4, 16)
    assert cfg.tuner().refine == 0.5
    # unreadable channel constraints: no channel variants at all, rather than guessing a range
    bad = exploration() | {"constraints": {"channels": {"min": 0, "max": 99}}}
    cfg = load(config_dir(exploration_json=bad), ENV)
    assert cfg.channel_range is None
    assert cfg.tuner().refine == 0.0


def test_a_configmap_from_an_operator_that_still_wrote_reward_weights_loads(
    config_dir: ConfigDir,
) -> None:
    """The policy's rewardWeights were removed (nothing in the cluster acted on them);
    ConfigMaps an older operator wrote still carry the key, and a new sidecar ignores it."""
    written = exploration() | {"reward_weights": {"latency": 1.0, "switching": 0.5}}
    cfg = load(config_dir(exploration_json=written), ENV)
    assert cfg.warnings == ()
    assert not hasattr(cfg.exploration, "reward_weights")
    assert cfg.exploration == load(config_dir(), ENV).exploration


def test_flags_win_over_the_environment(config_dir: ConfigDir, tmp_path: Path) -> None:
    cfg = load(
        config_dir(),
        ENV | {"DYNAMICCL_VOTERS": "5", "DYNAMICCL_EPOCH_INTERVAL": "1024"},
        pod_name="other",
        voters=3,
        shm_path=tmp_path / "x.shm",
    )
    assert (cfg.pod_name, cfg.voters, cfg.epoch_interval) == ("other", 3, 1024)
    assert cfg.shm_path == tmp_path / "x.shm"
    assert cfg.ca_file is None  # no CA file anywhere: the system bundle


def test_the_operators_placeholder_table_means_nccl_everywhere(config_dir: ConfigDir) -> None:
    placeholder = {
        "format": "dynamiccl.table/v1",
        "version": 1,
        "model_version": "default",
        "cells": [],
        "default": "nccl",
        "reason": "observe",
    }
    cfg = load(config_dir(table_json=placeholder, exploration_json=None), ENV)
    assert cfg.table is None
    assert cfg.table_reason == "observe"
    assert not cfg.learned
    assert cfg.exploration.mode is Mode.OBSERVE
    assert any("exploration.json: missing" in w for w in cfg.warnings)


@pytest.mark.parametrize(
    ("keys", "needle"),
    [
        ({"table_json": {"version": 0, "scales": []}}, "table.json: version"),
        ({"features_json": "{"}, "features.json: not JSON"),
        ({"exploration_json": {"mode": "sometimes"}}, "exploration.json: mode"),
    ],
)
def test_a_bad_optional_key_costs_only_a_feature(
    config_dir: ConfigDir, keys: dict[str, object], needle: str
) -> None:
    cfg = load(config_dir(**keys), ENV)
    assert any(needle in w for w in cfg.warnings), cfg.warnings


@pytest.mark.parametrize(
    ("keys", "env", "needle"),
    [
        ({"job_json": None}, ENV, "job.json: missing"),
        ({"job_json": "[1"}, ENV, "job.json: not JSON"),
        ({"job_json": {**JOB, "uid": "bad uid!"}}, ENV, "job.json: uid"),
        ({"job_json": {**JOB, "extra": 1}}, ENV, "job.json: extra"),
        ({}, {"DYNAMICCL_POD_NAME": "p"}, "DYNAMICCL_POD_UID: not set"),
        ({}, ENV | {"DYNAMICCL_EPOCH_INTERVAL": "100"}, "DYNAMICCL_EPOCH_INTERVAL"),
        ({}, ENV | {"DYNAMICCL_VOTERS": "many"}, "DYNAMICCL_VOTERS: not an integer"),
    ],
)
def test_an_unusable_config_is_one_line_naming_the_source(
    config_dir: ConfigDir, keys: dict[str, object], env: dict[str, str], needle: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(config_dir(**keys), env)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_pod_identity_falls_back_to_the_projected_tokens_claims(
    config_dir: ConfigDir, tmp_path: Path
) -> None:
    claims = {"kubernetes.io": {"pod": {"name": "from-token", "uid": "uid-from-token"}}}
    part = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    token = tmp_path / "token"
    token.write_text(f"e30.{part}.sig")
    cfg = load(config_dir(), {"DYNAMICCL_INGEST_TOKEN_FILE": str(token)})
    assert (cfg.pod_name, cfg.pod_uid) == ("from-token", "uid-from-token")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda kids: (
            st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_any_json_in_any_key_gives_a_config_or_a_config_error(
    config_dir: ConfigDir, doc: object
) -> None:
    for key in ("job_json", "table_json", "features_json", "exploration_json"):
        with contextlib.suppress(ConfigError):
            load(config_dir(**{key: doc}), ENV)


def test_a_table_of_the_32_scale_classes_is_refused_with_its_reason(config_dir: ConfigDir) -> None:
    """A table.json written before the 128 scale classes (no `scale_encoding`; class 31 meant
    every communicator over 64 nodes): the sidecar takes no table (NCCL's own choice), says
    why, and keeps the rest of its configuration."""
    old = {"version": 1, "scales": [31], "cells": [
        {"collective": "allreduce", "bucket": 20, "scale": 31,
         "choices": [{"algo": "tree", "proto": "simple"}]}]}  # fmt: skip
    cfg = load(config_dir(table_json=old), ENV)
    assert cfg.table is None
    assert cfg.table_reason == "invalid table.json"
    assert any("table.json: scale_encoding" in w and "older DynamICCL" in w for w in cfg.warnings)
    assert cfg.job.uid == JOB["uid"]

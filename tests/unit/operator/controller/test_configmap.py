"""The per-job ConfigMap: owned by the job, deterministic, passthrough table until compile lands."""

from __future__ import annotations

import json

import pytest

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller import configmap as cm
from tests.topology_samples import h100_job

JOB = cm.JobRef("kubeflow.org/v1", "PyTorchJob", "llm", "team-a", "uid-1")


def _features() -> StateFeatures:
    return StateFeatures.model_validate(h100_job(nodes=1))


def _policy(**kw: object) -> NCCLTuningPolicySpec:
    return NCCLTuningPolicySpec.model_validate(kw)


def test_object_name_is_deterministic_and_bounded() -> None:
    assert cm.object_name("llm") == "llm-dynamiccl"
    long = cm.object_name("x" * 300)
    assert len(long) <= 253
    assert long == cm.object_name("x" * 300)
    assert long != cm.object_name("x" * 299)
    # the chart's job-config admission policy selects by this suffix (issue 32 C)
    for n in (1, 243, 244, 253):
        name = cm.object_name("y" * n)
        assert name.endswith("-dynamiccl")
        assert len(name) <= 253


def test_config_map_is_owned_by_the_job_and_carries_everything() -> None:
    policy = _policy(
        constraints={"envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256, 512], "default": 256}]}
    )
    obj = cm.build(
        JOB,
        _features(),
        "gold",
        policy,
        model_version="v1",
        canary=False,
        user_constraints={"NCCL_ALGO": "Ring"},
    )
    meta = obj["metadata"]
    assert meta["name"] == "llm-dynamiccl"
    assert meta["namespace"] == "team-a"
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["blockOwnerDeletion"]) == (
        "PyTorchJob",
        "uid-1",
        False,
    )
    assert meta["labels"][c.LABEL_JOB_NAME] == "llm"
    data = obj["data"]
    assert StateFeatures.model_validate_json(data[cm.KEY_FEATURES]) == _features()
    assert json.loads(data[cm.KEY_ENV]) == {"NCCL_NTHREADS": "256"}
    assert json.loads(data[cm.KEY_EXPLORATION])["user_constraints"] == {"NCCL_ALGO": "Ring"}
    job = json.loads(data[cm.KEY_JOB])
    assert job["table_digest"] == cm.digest(json.loads(data[cm.KEY_TABLE]))
    assert cm.read_env(obj) == {"NCCL_NTHREADS": "256"}
    again = cm.build(
        JOB,
        _features(),
        "gold",
        policy,
        model_version="v1",
        canary=False,
        user_constraints={"NCCL_ALGO": "Ring"},
    )
    assert again == obj


def test_observe_mode_sets_no_env_knobs() -> None:
    policy = _policy(
        mode="observe",
        constraints={"envKnobs": [{"name": "NCCL_BUFFSIZE", "allowed": [1024], "default": 1024}]},
    )
    assert cm.env_knobs(policy) == {}


def test_read_env_tolerates_garbage() -> None:
    assert cm.read_env({"data": {cm.KEY_ENV: "not json"}}) == {}
    assert cm.read_env({"data": {cm.KEY_ENV: "[1]"}}) == {}
    env = '{"PATH": "/x", "NCCL_A": 1, "NCCL_NTHREADS": 256}'
    assert cm.read_env({"data": {cm.KEY_ENV: env}}) == {"NCCL_NTHREADS": "256"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NCCL_NET_PLUGIN", "/tmp/evil.so"),  # issue 32 C: not a knob a policy can set
        ("LD_PRELOAD", "/tmp/evil.so"),
        ("NCCL_BUFFSIZE", "-1"),  # outside NCCL's documented range
        ("NCCL_BUFFSIZE", "17179869184"),  # 16 GiB
        ("NCCL_BUFFSIZE", "3000"),  # not a power of 2
        ("NCCL_NTHREADS", "0"),
        ("NCCL_NTHREADS", " 256"),  # not written plainly
        ("NCCL_MAX_NCHANNELS", "65"),
        ("NCCL_IB_QPS_PER_CONNECTION", "129"),
        ("NCCL_IB_SPLIT_DATA_ON_QPS", "2"),
        ("NCCL_NCHANNELS_PER_NET_PEER", "0"),
        ("NCCL_P2P_NET_CHUNKSIZE", "196608"),  # not a power of 2
        ("NCCL_SOCKET_NTHREADS", "17"),
        ("NCCL_NSOCKS_PERTHREAD", "65"),
        ("NCCL_CROSS_NIC", "-1"),
    ],
)
def test_read_env_keeps_only_what_a_policy_could_set(name: str, value: str) -> None:
    env = json.dumps({name: value, "NCCL_NTHREADS": "128"})
    assert cm.read_env({"data": {cm.KEY_ENV: env}}) == {"NCCL_NTHREADS": "128"}
    assert not cm.valid_knob(name, value)


def test_read_env_keeps_network_knobs_but_never_a_socket_count_over_nccls_limit() -> None:
    net = {
        "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_IB_SPLIT_DATA_ON_QPS": "0",
        "NCCL_NCHANNELS_PER_NET_PEER": "4",
        "NCCL_P2P_NET_CHUNKSIZE": "524288",
        "NCCL_CROSS_NIC": "0",
    }
    ok = net | {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "16"}  # 64 sockets
    assert cm.read_env({"data": {cm.KEY_ENV: json.dumps(ok)}}) == ok
    # 8 x 16 = 128 sockets: no policy arm sets that; NCCL would run 8 x 8 instead
    over = net | {"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "16"}
    assert cm.read_env({"data": {cm.KEY_ENV: json.dumps(over)}}) == net


@pytest.mark.parametrize(
    ("mode", "used"), [("learned", True), ("static", True), ("observe", False)]
)
def test_an_injected_compiler_makes_the_table(mode: str, used: bool) -> None:
    calls: list[str] = []

    def compiler(features: StateFeatures, policy: NCCLTuningPolicySpec, version: str) -> object:
        calls.append(version)
        return {"version": 3, "scales": [3], "cells": [], "compiled_for": version}

    table = cm.initial_table(_features(), _policy(mode=mode), "v7", compiler)
    assert calls == (["v7"] if used else [])
    assert (table.get("compiled_for") == "v7") is used
    obj = cm.build(JOB, _features(), "gold", _policy(mode=mode), model_version="v7",
                   canary=False, compiler=compiler)  # fmt: skip
    assert json.loads(obj["data"][cm.KEY_TABLE]) == table


def test_a_table_too_large_for_the_config_map_leaves_its_last_scale_classes_to_online_tuning() -> (
    None
):
    """8 scale classes of full cells: 1.05 MiB of JSON, more than a ConfigMap holds."""
    from dynamiccl.api.nccl import Algo, Collective, Proto  # noqa: PLC0415
    from dynamiccl.api.table import Candidate, Cell, Choice, DecisionTable  # noqa: PLC0415

    ch = Choice(algo=Algo.COLLNET_DIRECT, proto=Proto.SIMPLE, nchannels=255, chunk_bytes=1 << 31)
    cand = Candidate(**ch.model_dump(), weight=65535)
    scales = tuple(range(24, 32))
    full = DecisionTable(
        version=3,
        scales=scales,
        cells=tuple(
            Cell(collective=c, bucket=b, scale=s, choices=(ch,) * 4, candidates=(cand,) * 4,
                 explore=0.123456789)
            for s in scales for c in Collective for b in range(3, 36)
        ),
    )  # fmt: skip

    def compiler(features: StateFeatures, policy: NCCLTuningPolicySpec, version: str) -> object:
        return full

    table = cm.initial_table(_features(), _policy(mode="static"), "v7", compiler)
    obj = cm.build(JOB, _features(), "gold", _policy(mode="static"), model_version="v7",
                   canary=False, compiler=compiler)  # fmt: skip
    assert sum(len(v) for v in obj["data"].values()) < 1 << 20  # what the API server accepts
    assert len(obj["data"][cm.KEY_TABLE]) <= cm.MAX_TABLE_JSON
    kept = DecisionTable.model_validate(table)
    assert kept.scales == scales[: len(kept.scales)]  # the first ones (world, node, ...) stay
    assert 4 <= len(kept.scales) < 8
    assert {c.scale for c in kept.cells} == set(kept.scales)
    small = {"version": 3, "scales": [3], "cells": []}
    assert cm.fit_table(small) == small

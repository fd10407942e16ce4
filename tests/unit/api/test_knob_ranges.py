"""Env-knob values outside NCCL's documented ranges, and arms over NCCL's socket limit, are
refused by the policy model (tests/unit/operator/test_crdgen.py runs the same cases through
the CRD's CEL rules; tests/integration/operator/test_policy_validation_kube.py through a
real apiserver)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from dynamiccl.api.knob_experiment import KnobName
from dynamiccl.api.knob_ranges import KNOB_VALUES, exceeded_products, knob_range_text
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from tests.knob_samples import OUTSIDE_NCCL_RANGE

K = KnobName
OUTSIDE = OUTSIDE_NCCL_RANGE


def _spec(*knobs: dict[str, Any]) -> dict[str, Any]:
    return {"constraints": {"envKnobs": list(knobs)}}


def test_every_knob_has_its_documented_range() -> None:
    assert set(KNOB_VALUES) == set(KnobName)
    assert knob_range_text(K.NCCL_IB_QPS_PER_CONNECTION) == "1..128"
    assert knob_range_text(K.NCCL_IB_SPLIT_DATA_ON_QPS) == "0..1"
    assert knob_range_text(K.NCCL_CROSS_NIC) == "0..2"
    assert knob_range_text(K.NCCL_SOCKET_NTHREADS) == "1..16"
    assert knob_range_text(K.NCCL_NSOCKS_PERTHREAD) == "1..64"
    assert knob_range_text(K.NCCL_NCHANNELS_PER_NET_PEER) == "1..64"
    assert knob_range_text(K.NCCL_P2P_NET_CHUNKSIZE) == "a power of 2 from 1024 to 16777216"
    assert knob_range_text(K.NCCL_NTHREADS) == "64, 128, 256, 512"


@pytest.mark.parametrize("name", list(OUTSIDE))
def test_both_ends_of_a_network_knobs_range_are_accepted(name: KnobName) -> None:
    values = KNOB_VALUES[name]
    spec = NCCLTuningPolicySpec.model_validate(
        _spec({"name": name.value, "allowed": [values[0], values[-1]], "default": values[0]})
    )
    assert spec.constraints.env_knobs[0].allowed == [values[0], values[-1]]


@pytest.mark.parametrize(("name", "bad"), [(n, v) for n, vs in OUTSIDE.items() for v in vs])
def test_a_value_outside_nccls_range_is_refused(name: KnobName, bad: int) -> None:
    good = KNOB_VALUES[name][0]
    with pytest.raises(ValidationError) as err:
        NCCLTuningPolicySpec.model_validate(_spec({"name": name.value, "allowed": [good, bad]}))
    text = str(err.value)
    assert f"{name.value} values must be {knob_range_text(name)}" in text
    assert f"got {bad}" in text


def _sockets(thread_values: list[int], sock_values: list[int], **defaults: int) -> dict[str, Any]:
    t: dict[str, Any] = {"name": "NCCL_SOCKET_NTHREADS", "allowed": thread_values}
    s: dict[str, Any] = {"name": "NCCL_NSOCKS_PERTHREAD", "allowed": sock_values}
    if "threads" in defaults:
        t["default"] = defaults["threads"]
    if "socks" in defaults:
        s["default"] = defaults["socks"]
    return _spec(t, s)


@pytest.mark.parametrize(
    ("spec", "arm"),
    [
        # the arm that moves NSOCKS_PERTHREAD to 8 keeps the default 16 threads: 128 sockets
        (_sockets([4, 16], [1, 8], threads=16, socks=1), "NCCL_NSOCKS_PERTHREAD=8"),
        # the arm that moves SOCKET_NTHREADS to 16 keeps the default 8 sockets per thread
        (_sockets([1, 16], [8], threads=1, socks=8), "NCCL_SOCKET_NTHREADS=16"),
    ],
)
def test_an_arm_over_nccls_socket_limit_is_refused(spec: dict[str, Any], arm: str) -> None:
    with pytest.raises(ValidationError) as err:
        NCCLTuningPolicySpec.model_validate(spec)
    assert "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must not exceed 64" in str(err.value)
    assert arm in str(err.value)


@pytest.mark.parametrize(
    "spec",
    [
        _sockets([4, 16], [1, 4], threads=16, socks=4),  # 64 at most: NCCL's limit, allowed
        _sockets([16], [64]),  # no defaults: no arm sets both (each moves one knob)
        # the arm moving NSOCKS_PERTHREAD to 64 leaves SOCKET_NTHREADS to NCCL (no default)
        _sockets([16], [1, 64], socks=1),
    ],
)
def test_arms_within_the_socket_limit_are_accepted(spec: dict[str, Any]) -> None:
    NCCLTuningPolicySpec.model_validate(spec)


@given(threads=st.integers(1, 16), socks=st.integers(1, 64))
def test_the_product_rule_is_exactly_nccls(threads: int, socks: int) -> None:
    over = threads * socks > 64
    got = exceeded_products({K.NCCL_SOCKET_NTHREADS: threads, K.NCCL_NSOCKS_PERTHREAD: socks})
    assert got == ([(K.NCCL_SOCKET_NTHREADS, K.NCCL_NSOCKS_PERTHREAD)] if over else [])
    spec = _sockets([threads], [socks], threads=threads, socks=socks)
    if over:
        with pytest.raises(ValidationError):
            NCCLTuningPolicySpec.model_validate(spec)
    else:
        NCCLTuningPolicySpec.model_validate(spec)

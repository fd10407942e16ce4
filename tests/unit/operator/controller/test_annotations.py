"""Annotation parsing: every malformed value is an error naming the key; never a crash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiccl import constants as c
from dynamiccl.api.features import CclLibrary, Compression, Parallelism, SyncMode
from dynamiccl.operator.controller import annotations as ann


def test_absent_annotations_mean_plain_ddp() -> None:
    parsed = ann.parse({})
    assert parsed.valid
    assert parsed.tune is None
    assert parsed.workload.parallelism is Parallelism.DP
    assert parsed.ccl is CclLibrary.NCCL


def test_full_set_parses() -> None:
    parsed = ann.parse(
        {
            c.ANNOTATION_TUNE: "True",
            c.ANNOTATION_PARALLELISM: "3d:dp=4,tp=8,pp=2",
            c.ANNOTATION_MODEL_SIZE: "1.3B",
            c.ANNOTATION_SYNC_MODE: "local-sgd:16",
            c.ANNOTATION_COMPRESSION: "topk:0.01",
            c.ANNOTATION_C2C_RATIO: "2.5",
            c.ANNOTATION_CCL: "nccl",
            c.ANNOTATION_INA: "false",
            c.ANNOTATION_POLICY: "gold",
            "unrelated.io/x": "whatever",
        }
    )
    assert parsed.errors == ()
    assert parsed.tune is True
    w = parsed.workload
    assert w.parallelism is Parallelism.THREE_D
    assert (w.degrees.dp, w.degrees.tp, w.degrees.pp) == (4, 8, 2)
    assert w.model_params == pytest.approx(1.3e9)
    assert (w.sync_mode, w.local_steps) == (SyncMode.LOCAL_SGD, 16)
    assert (w.compression, w.compression_ratio) == (Compression.TOPK, 0.01)
    assert w.c2c_ratio == 2.5
    assert parsed.policy == "gold"


def test_context_parallel_degree_parses() -> None:
    parsed = ann.parse({c.ANNOTATION_PARALLELISM: "3d:tp=4, cp=2,pp=4,dp=8"})
    assert parsed.errors == ()
    d = parsed.workload.degrees
    assert (d.tp, d.cp, d.pp, d.dp, d.product) == (4, 2, 4, 8, 256)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        (c.ANNOTATION_TUNE, "yes", "true or false"),
        (c.ANNOTATION_PARALLELISM, "zero", "expected one of"),
        (c.ANNOTATION_PARALLELISM, "3d:dp=4,xx=2", "DIM=N"),
        (c.ANNOTATION_PARALLELISM, "3d:dp=4,dp=2", "twice"),
        (c.ANNOTATION_PARALLELISM, "tp:tp=0", "out of range"),
        (c.ANNOTATION_MODEL_SIZE, "huge", "parameter count"),
        (c.ANNOTATION_SYNC_MODE, "bsp:3", "only local-sgd"),
        (c.ANNOTATION_COMPRESSION, "topk", "needs :RATIO"),
        (c.ANNOTATION_COMPRESSION, "topk:2", "(0, 1]"),
        (c.ANNOTATION_COMPRESSION, "fp16:0.5", "fixed ratio"),
        (c.ANNOTATION_C2C_RATIO, "-1", "non-negative"),
        (c.ANNOTATION_CCL, "nvshmem", "expected one of"),
        (c.ANNOTATION_POLICY, "Gold", "NCCLTuningPolicy name"),
        (c.GROUP + "/tunee", "true", "unknown dynamiccl.io annotation"),
    ],
)
def test_malformed_values_are_reported_with_key_and_reason(
    key: str, value: str, needle: str
) -> None:
    parsed = ann.parse({key: value})
    assert not parsed.valid
    [err] = parsed.errors
    assert err.key == key
    assert needle in err.message
    assert key in str(err)


def test_out_of_model_range_steps_are_an_error_not_a_crash() -> None:
    parsed = ann.parse({c.ANNOTATION_SYNC_MODE: "local-sgd:999999999"})
    assert not parsed.valid
    assert "local_steps" in parsed.errors[0].message


def test_namespace_label_opts_in_unless_job_says_no() -> None:
    ns = {c.LABEL_NAMESPACE_TUNE: "true"}
    assert ann.opted_in(ann.parse({}), ns)
    assert not ann.opted_in(ann.parse({c.ANNOTATION_TUNE: "false"}), ns)
    assert not ann.opted_in(ann.parse({}), {})
    assert ann.opted_in(ann.parse({c.ANNOTATION_TUNE: "true"}), {})


def test_our_own_annotations_are_not_errors() -> None:
    assert ann.parse({c.ANNOTATION_INJECTED: "x"}).valid


_KEYS = st.sampled_from([*ann._FIELDS, c.GROUP + "/bogus", "other/key"])


@settings(max_examples=400)
@given(st.dictionaries(_KEYS, st.text(max_size=300), max_size=8))
def test_fuzz_never_raises_and_errors_name_real_keys(annotations: dict[str, str]) -> None:
    parsed = ann.parse(annotations)
    for err in parsed.errors:
        assert err.key in annotations or err.key == c.GROUP + "/*"
    bad_keys = {e.key for e in parsed.errors}
    if not bad_keys and c.ANNOTATION_TUNE in annotations:
        assert parsed.tune is not None


@given(
    st.sampled_from(list(Parallelism)),
    st.dictionaries(st.sampled_from(["dp", "tp", "pp", "ep"]), st.integers(1, 1024), max_size=4),
)
def test_parallelism_round_trips(mode: Parallelism, degrees: dict[str, int]) -> None:
    text = mode.value + (":" + ",".join(f"{k}={v}" for k, v in degrees.items()) if degrees else "")
    parsed = ann.parse({c.ANNOTATION_PARALLELISM: text})
    assert parsed.valid, parsed.errors
    assert parsed.workload.parallelism is mode
    for k, v in degrees.items():
        assert getattr(parsed.workload.degrees, k) == v

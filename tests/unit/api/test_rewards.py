"""Reward records: strict, bounded, self-consistent; the digest identifies a payload."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dynamiccl.api.rewards import (
    MAX_BATCH_BODY_BYTES,
    MAX_RECORDS_PER_BATCH,
    RewardBatch,
    RewardRecord,
    payload_sha256,
)

POD_UID = "8f1c2b7e-0000-4000-8000-000000000001"


def record(**over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "collective": "allreduce",
        "size_bucket": 20,
        "nbytes_min": 1 << 20,
        "nbytes_max": (2 << 20) - 1,
        "nranks": 8,
        "nnodes": 1,
        "algo": "ring",
        "proto": "simple",
        "nchannels": 0,
        "chunk_bytes": 0,
        "origin": "table",
        "count": 100,
        "mean_time_us": 120.5,
        "p50_time_us": 118.0,
        "p99_time_us": 140.0,
        "busbw_GBps": 150.0,
        "nccl_default_time_us": 130.0,
    }
    rec.update(over)
    return rec


def batch(records: list[dict[str, Any]] | None = None, **over: Any) -> dict[str, Any]:
    b: dict[str, Any] = {
        "idempotency_key": f"{POD_UID}/7",
        "job": {"namespace": "team-a", "kind": "PyTorchJob", "name": "llm", "uid": "job-uid-1"},
        "pod": {"name": "llm-worker-0", "uid": POD_UID},
        "model_version": "v3",
        "table_version": 2,
        "records": [record()] if records is None else records,
    }
    b.update(over)
    return b


def test_valid_batch_parses_from_json_and_python_alike() -> None:
    raw = batch()
    a = RewardBatch.model_validate_json(json.dumps(raw))
    b = RewardBatch.model_validate(raw)
    assert a == b
    assert a.calls == 100
    assert a.records[0].speedup == pytest.approx(130.0 / 120.5)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("count", "100"),
        ("count", True),
        ("count", 0),
        ("mean_time_us", "1.5"),
        ("mean_time_us", 0.0),
        ("mean_time_us", -1.0),
        ("mean_time_us", 1e-300),  # issue 19: an absurd time made the speedup infinite
        ("mean_time_us", 5e-4),  # under MIN_TIME_US (1 ns)
        ("nccl_default_time_us", 1e-9),
        ("busbw_GBps", -0.1),
        ("nchannels", 65),
        ("algo", "bogus"),
        ("collective", "alltoall"),
        ("nnodes", 9),  # more nodes than ranks
        ("p50_time_us", 150.0),  # p50 above p99
        ("nbytes_min", 1 << 22),  # min above max
        ("size_bucket", 65),
        ("extra_field", 1),
    ],
)
def test_bad_record_fields_are_rejected(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        RewardBatch.model_validate_json(json.dumps(batch([record(**{field: value})])))


def test_nan_and_infinity_are_rejected() -> None:
    raw = json.dumps(batch([record(mean_time_us=1.0)])).replace("1.0,", "NaN,", 1)
    with pytest.raises(ValidationError):
        RewardBatch.model_validate_json(raw)


def test_idempotency_key_must_be_the_pods_own() -> None:
    with pytest.raises(ValidationError, match="pod uid"):
        RewardBatch.model_validate(batch(idempotency_key="other-pod/7"))
    with pytest.raises(ValidationError):
        RewardBatch.model_validate(batch(idempotency_key=f"{POD_UID}/x"))


def test_duplicate_record_keys_are_rejected() -> None:
    with pytest.raises(ValidationError, match="repeats"):
        RewardBatch.model_validate(batch([record(), record(count=5)]))
    # same bucket, other configuration: fine
    RewardBatch.model_validate(batch([record(), record(algo="tree")]))


def test_empty_batch_is_rejected() -> None:
    with pytest.raises(ValidationError, match="at least one"):
        RewardBatch.model_validate(batch([]))


def test_record_limit() -> None:
    recs = [record(nbytes_min=i, nbytes_max=i) for i in range(MAX_RECORDS_PER_BATCH + 1)]
    with pytest.raises(ValidationError):
        RewardBatch.model_validate(batch(recs))
    ok = RewardBatch.model_validate(batch(recs[:-1]))
    # the largest valid batch fits the body limit with room to spare
    assert len(ok.model_dump_json()) < MAX_BATCH_BODY_BYTES // 2


def test_string_limits() -> None:
    long_name = "a" * 254
    with pytest.raises(ValidationError):
        RewardBatch.model_validate(
            batch(job={"namespace": "a", "kind": "PyTorchJob", "name": long_name, "uid": "u"})
        )
    with pytest.raises(ValidationError):
        RewardBatch.model_validate(batch(model_version="v" * 129))


def test_models_are_frozen() -> None:
    rec = RewardRecord.model_validate(record())
    with pytest.raises(ValidationError):
        rec.count = 5


def test_digest_is_stable_across_equivalent_encodings() -> None:
    a = RewardBatch.model_validate_json(json.dumps(batch([record(mean_time_us=120)])))
    b = RewardBatch.model_validate_json(json.dumps(batch([record(mean_time_us=120.0)]), indent=2))
    c = RewardBatch.model_validate(batch([record(mean_time_us=120.25)]))
    assert payload_sha256(a) == payload_sha256(b)
    assert payload_sha256(a) != payload_sha256(c)


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(1, 2**40),
    p50=st.floats(0.001, 1e6),
    spread=st.floats(0, 1e6),
    coll=st.sampled_from(["allreduce", "allgather", "broadcast"]),
)
def test_round_trip(count: int, p50: float, spread: float, coll: str) -> None:
    raw = batch([record(count=count, p50_time_us=p50, p99_time_us=p50 + spread, collective=coll)])
    b = RewardBatch.model_validate(raw)
    again = RewardBatch.model_validate_json(b.model_dump_json())
    assert again == b
    assert payload_sha256(again) == payload_sha256(b)


# --- step times (issue 31) -----------------------------------------------------------------


def test_a_batch_without_step_times_is_accepted_and_digests_as_before() -> None:
    raw = batch()
    b = RewardBatch.model_validate(raw)
    assert b.steps is None
    before = json.loads(b.model_dump_json())
    del before["steps"]  # the body an operator before issue 31 digested
    compact = json.dumps(before, separators=(",", ":"), ensure_ascii=False).encode()
    assert payload_sha256(b) == hashlib.sha256(compact).hexdigest()


def test_step_times_round_trip_and_change_the_digest() -> None:
    steps = {"status": "found", "steps": 120, "median_us": 19_347.5, "spread_us": 58.2}
    b = RewardBatch.model_validate_json(json.dumps(batch(steps=steps)))
    assert b.steps is not None
    assert b.steps.median_us == 19_347.5
    assert payload_sha256(b) != payload_sha256(RewardBatch.model_validate(batch()))
    assert RewardBatch.model_validate(batch(steps={"status": "none"})).steps is not None


@pytest.mark.parametrize(
    "steps",
    [
        {"status": "found", "steps": 3},  # steps without a median
        {"status": "found", "median_us": 10.0},  # a median without steps
        {"status": "none", "steps": 3, "median_us": 10.0},  # steps while none was found
        {"status": "found", "steps": 3, "median_us": 10.0, "spread_us": -1.0},
        {"status": "found", "steps": 3, "median_us": float("nan")},
        {"status": "found", "steps": "3", "median_us": 10.0},  # strict: no coercion
        {"status": "maybe"},
        {"status": "found", "steps": 3, "median_us": 10.0, "extra": 1},
        {"status": "none", "spread_us": 1.0},
    ],
)
def test_bad_step_times_are_rejected(steps: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RewardBatch.model_validate(batch(steps=steps))


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["status", "steps", "median_us", "spread_us", "x"]),
        st.one_of(
            st.none(),
            st.integers(-(2**60), 2**60),
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from(["found", "none", "learning", ""]),
            st.text(max_size=8),
        ),
    )
)
def test_fuzz_step_times_parse_or_are_refused_clearly(steps: dict[str, Any]) -> None:
    body = json.dumps(batch(steps=steps))
    try:
        b = RewardBatch.model_validate_json(body)
    except ValidationError:
        return
    assert b.steps is not None
    assert (b.steps.steps > 0) == (b.steps.median_us is not None)
    assert RewardBatch.model_validate_json(b.model_dump_json()) == b

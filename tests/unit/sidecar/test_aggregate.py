"""Aggregation of measured collectives into reward records."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.rewards import Origin, RewardRecord
from dynamiccl.sidecar.aggregate import Aggregator, Key, Stats, bus_factor, to_record


def key(version: int = 1, bucket: int = 20, origin: str = "table", nranks: int = 8) -> Key:
    return Key(version, 4, bucket, nranks, 1, 1, 2, 0, 0, origin)


def exact_quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(1, math.ceil(q * len(s))) - 1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.5, 1e7, allow_nan=False), min_size=1, max_size=400),
)
def test_quantiles_are_within_the_bin_width_of_the_exact_order_statistics(xs: list[float]) -> None:
    s = Stats()
    for x in xs:
        s.add(1024, x)
    for q in (0.5, 0.99):
        got, want = s.quantile(q), exact_quantile(xs, q)
        assert abs(math.log2(got / want)) <= 1.0 / 32 + 1e-9, (q, got, want)
        assert min(xs) <= got <= max(xs)
    assert s.quantile(0.5) <= s.quantile(0.99)
    assert s.count == len(xs)
    assert s.mean_us == pytest.approx(sum(xs) / len(xs))


def test_bus_factors_follow_nccl_tests() -> None:
    assert bus_factor(4, 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor(2, 8) == pytest.approx(7 / 8)
    assert bus_factor(3, 4) == pytest.approx(3 / 4)
    assert bus_factor(0, 8) == 1.0
    assert bus_factor(1, 8) == 1.0
    assert bus_factor(4, 1) == 0.0


def test_record_carries_counts_times_busbw_and_the_baseline() -> None:
    agg = Aggregator()
    times = [10.0, 11.0, 12.0, 50.0]
    for t in times:
        assert agg.add(key(), 1 << 20, t)
    agg.add(key(origin="explore"), 1 << 20, 30.0)
    assert len(agg) == 2
    assert agg.calls == 5
    _, (k, st_) = agg.take(10)  # sorted: "explore" < "table"
    rec = to_record(k, st_, nccl_default_time_us=20.0)
    assert isinstance(rec, RewardRecord)
    assert (rec.collective, rec.algo, rec.proto, rec.origin) == (
        Collective.ALLREDUCE,
        Algo.RING,
        Proto.SIMPLE,
        Origin.TABLE,
    )
    assert (rec.count, rec.nbytes_min, rec.nbytes_max, rec.size_bucket) == (4, 1 << 20, 1 << 20, 20)
    assert rec.mean_time_us == pytest.approx(sum(times) / 4)
    assert rec.p50_time_us == pytest.approx(11.0, rel=0.012)
    assert rec.p99_time_us == pytest.approx(50.0, rel=0.012)
    # busbw = total bytes / total time * 2(n-1)/n
    assert rec.busbw_GBps == pytest.approx(4 * (1 << 20) / (sum(times) * 1e3) * 14 / 8)
    assert rec.nccl_default_time_us == 20.0
    assert rec.speedup == pytest.approx(20.0 / rec.mean_time_us)
    assert len(agg) == 0


def test_keys_are_bounded_and_bad_samples_refused() -> None:
    agg = Aggregator(max_keys=3)
    for b in range(3):
        assert agg.add(key(bucket=b), 8, 1.0)
    assert not agg.add(key(bucket=9), 8, 1.0)  # a fourth key
    assert agg.add(key(bucket=1), 8, 2.0)  # an existing key still takes samples
    assert not agg.add(key(bucket=1), 8, 0.0)
    assert not agg.add(key(bucket=1), 8, float("nan"))
    assert not agg.add(key(bucket=1), -1, 1.0)
    assert agg.refused == 4
    assert len(agg) == 3


def test_take_is_per_table_version_and_in_a_stable_order() -> None:
    agg = Aggregator()
    for v, b in ((2, 5), (1, 7), (1, 3), (2, 1)):
        agg.add(key(version=v, bucket=b), 8, 1.0)
    assert agg.versions() == [1, 2]
    got = agg.take(10, table_version=1)
    assert [(k.table_version, k.bucket) for k, _ in got] == [(1, 3), (1, 7)]
    assert agg.versions() == [2]
    assert [k.bucket for k, _ in agg.take(1)] == [1]
    assert len(agg) == 1


def test_state_round_trips_through_json() -> None:
    rng = random.Random(3)
    agg = Aggregator()
    for _ in range(500):
        k = key(bucket=rng.randrange(4), origin=rng.choice(["table", "default"]))
        agg.add(k, 64, rng.uniform(1, 100))
    agg.refused = 7
    again = Aggregator.from_state(json.loads(json.dumps(agg.to_state())))
    assert again.refused == 7
    assert [(k, s.to_state()) for k, s in again.items()] == [
        (k, s.to_state()) for k, s in agg.items()
    ]
    for (k1, s1), (k2, s2) in zip(again.items(), agg.items(), strict=True):
        assert to_record(k1, s1, 5.0) == to_record(k2, s2, 5.0)


def test_out_of_range_values_are_clamped_into_valid_records() -> None:
    s = Stats()
    s.add(8, 1e-9 + 1e-4)  # far below a microsecond
    rec = to_record(key(nranks=1), s, nccl_default_time_us=0.0)
    assert rec.mean_time_us > 0
    assert rec.nccl_default_time_us > 0
    assert rec.busbw_GBps == 0.0  # one rank: no bus traffic

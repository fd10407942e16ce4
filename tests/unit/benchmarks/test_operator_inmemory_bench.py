"""The pure helpers of benchmarks/operator_inmemory_bench.py: its quantiles, its fit (the
extrapolation it prints) and its curve argument."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.benchmarks.bench_module import BENCH, bench_module

bench = bench_module("operator_inmemory_bench")  # it imports its sibling scale_cluster by name


def test_percentile_is_the_nearest_rank() -> None:
    xs = [float(x) for x in range(1, 101)]  # 1..100
    assert bench.percentile(xs, 0.5) == 50.0
    assert bench.percentile(xs, 0.99) == 99.0
    assert bench.percentile(xs, 1.0) == 100.0
    assert bench.percentile([7.0], 0.99) == 7.0
    assert math.isnan(bench.percentile([], 0.5))


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0.01, 1.0))
def test_percentile_is_one_of_the_values_and_at_least_that_share_lies_at_or_below(
    xs: list[float], q: float
) -> None:
    p = bench.percentile(xs, q)
    assert p in xs
    assert sum(x <= p for x in xs) >= q * len(xs) - 1e-9


def test_linear_fit_recovers_a_line_and_refuses_one_point() -> None:
    a, b = bench.linear_fit([1.0, 2.0, 4.0], [5.0, 7.0, 11.0])  # y = 3 + 2x
    assert (round(a, 9), round(b, 9)) == (3.0, 2.0)
    with pytest.raises(ValueError, match="two or more"):
        bench.linear_fit([1.0, 1.0], [2.0, 3.0])


def test_curve_argument() -> None:
    assert bench.parse_curve("1250:500, 12500:5000") == [(1250, 500), (12500, 5000)]
    for bad in ("1250", "a:5", "0:5", "5:-1", "5:"):
        with pytest.raises(ValueError, match="NODES:JOBS"):
            bench.parse_curve(bad)


def test_extrapolation_adds_the_jobs_share_to_the_caches_at_the_target_nodes() -> None:
    """Caches grow 1 MiB per 1 000 nodes from 90; each job keeps 10 KiB above them and
    peaks 20 KiB above them; CPU per job grows 1 ms per 1 000 nodes from 40."""

    def point(nodes: int, jobs: int) -> dict[str, object]:
        caches = 90 + nodes / 1000
        return {
            "nodes": nodes,
            "jobs": jobs,
            "rss_caches_mib": caches,
            "rss_steady_mib": caches + jobs * 10 / 1024,
            "rss_peak_mib": caches + jobs * 20 / 1024,
            "job_created": {"cpu_ms": 40 + nodes / 1000},
        }

    got = bench.extrapolate([point(1000, 100), point(5000, 500), point(10000, 1000)], (20000, 4000))
    assert round(got["RSS after the caches MiB"], 6) == 110.0
    assert round(got["RSS kept MiB"], 6) == round(110 + 4000 * 10 / 1024, 6)
    assert round(got["RSS kept KiB per job"], 6) == 10.0
    assert round(got["RSS peak MiB"], 6) == round(110 + 4000 * 20 / 1024, 6)
    assert round(got["job created CPU ms"], 6) == 60.0


def test_a_burst_over_two_webhook_replicas_mutates_every_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replica processes of the operator's webhook, the connections spread over them:
    every pod of the job is answered with its patch, cached and cold."""
    monkeypatch.syspath_prepend(str(BENCH))  # the spawned processes import the script by name
    burst = bench_module("webhook_burst").burst_run(24, 4, replicas=2)
    assert burst["replicas"] == 2
    for phase in ("cached", "cold"):
        assert burst[phase]["mutated"] == burst[phase]["pods"] == 24
        assert burst[phase]["cpu_ms_per_pod"] > 0
    assert burst["cached"]["api_calls_per_pod"] == 0  # the cache answered
    assert burst["cold"]["api_calls_per_pod"] > 0  # the miss path asked the stand-in

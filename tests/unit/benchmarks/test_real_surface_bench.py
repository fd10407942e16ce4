"""`real_surface_bench`: the product's tuner on real NCCL's measured 2-rank surface finds the
tree/SIMPLE departure NCCL's own ring misses, and its figures are the measured ones."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.benchmarks.bench_module import bench_module

rsb = bench_module("real_surface_bench")

AR64, AR256 = "allreduce 67108864", "allreduce 268435456"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    out: dict[str, Any] = rsb.bench([2], seeds=1, budgets=[200])
    return out


def test_the_departures_are_real_nccls_and_every_setting_finds_them(doc: dict[str, Any]) -> None:
    two = doc["ranks"]["2"]
    assert two["departures"] == [AR64, AR256]  # the README's 17.4 % / 22.2 %, nothing else
    assert len(two["runs"]) == 6  # 2 defaults x 3 settings
    for label, run in two["runs"].items():
        # NCCL's pick: the surface's ring/SIMPLE row at NCCL's channel count
        for bucket, speed in ((AR64, 36599.699 / 30215.635), (AR256, 144827.901 / 112648.084)):
            d = run["departures"][bucket]
            assert d["found"] == 1.0, label
            assert d["chosen"] == {"tree/simple/-": 1}, label
            assert d["speedup"] == pytest.approx(speed, rel=1e-9), label
            assert d["cost_vs_nccl"] < 0, label  # exploring there already beats NCCL's ring


def test_the_disastrous_point_is_reported_as_measured(doc: dict[str, Any]) -> None:
    """ring/LL at 4 MiB (144.6 ms against tree/SIMPLE's 4.69) is the slowest point played,
    and the report counts its calls; the final choices lose to NCCL's pick nowhere."""
    run = doc["ranks"]["2"]["runs"]["real pick | bench tune | 200 calls"]
    assert run["slowest_where"] == "allreduce 4194304"
    assert run["slowest_played"] == pytest.approx(144612.912 / 4691.309)
    assert run["slowest_calls"] >= 1
    assert run["speedup_worst"] >= 0.99
    assert "slowest played 30.8x best" in rsb.render(doc)


def test_a_budget_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        rsb.main(["--budgets", "0", "--ranks", "2"])
    assert "every budget must be >= 1" in capsys.readouterr().err

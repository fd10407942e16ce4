"""Which pairs the sidecar's table leaves out get a look (online/probes.py), and that the
sidecar and `bench tune` apply the same rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.policy.online.probes import probe_order


def test_pairs_within_reach_of_the_best_estimate_best_first() -> None:
    est = {"ring/ll": 40.0, "tree/simple": 10.0, "ring/simple": 12.0, "tree/ll": 14.0}
    # the best pair is the table's own: it sets the limit, but is not probed
    assert probe_order(est, {"tree/simple"}, 0.5) == ["ring/simple", "tree/ll"]
    assert probe_order(est, {"tree/simple"}, 0.25) == ["ring/simple"]
    assert probe_order(est, {"tree/simple"}, 3.0) == ["ring/simple", "tree/ll", "ring/ll"]
    assert probe_order(est, set(est), 10.0) == []


def test_pairs_nccl_cannot_run_are_never_probed() -> None:
    est = {"a": math.inf, "b": math.nan, "c": 5.0, "d": 0.0}
    assert probe_order(est, (), 100.0) == ["c"]
    assert probe_order({"a": math.inf}, (), 1.0) == []
    with pytest.raises(ValueError, match="reach"):
        probe_order(est, (), -0.1)


times = st.floats(min_value=1e-3, max_value=1e6) | st.just(math.inf)


@given(
    st.dictionaries(st.integers(0, 20), times, max_size=12),
    st.sets(st.integers(0, 20)),
    st.floats(0, 10),
)
def test_the_order_is_exactly_the_gate(est: dict[int, float], have: set[int], reach: float) -> None:
    got = probe_order(est, have, reach)
    finite = [t for t in est.values() if math.isfinite(t)]
    limit = (1 + reach) * min(finite) if finite else -1.0
    want = {p for p, t in est.items() if p not in have and math.isfinite(t) and t <= limit}
    assert set(got) == want
    assert len(got) == len(want)
    assert [est[p] for p in got] == sorted(est[p] for p in got)


def test_the_sidecar_and_the_bench_gate_probes_with_the_same_rule() -> None:
    from dynamiccl.policy.eval import bench_tune  # noqa: PLC0415
    from dynamiccl.policy.online import probes  # noqa: PLC0415
    from dynamiccl.policy.online.tuner_config import TunerConfig, sidecar_setting  # noqa: PLC0415
    from dynamiccl.sidecar import tuning as sidecar  # noqa: PLC0415

    assert getattr(sidecar, "probe_order") is probes.probe_order  # noqa: B009
    assert getattr(bench_tune, "probe_order") is probes.probe_order  # noqa: B009
    race = sidecar_setting(TunerConfig()).race
    assert race is not None
    assert race.probe_pairs

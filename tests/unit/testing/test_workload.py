"""The demo's workload and its simulated time table agree with the simulator and NCCL's rules."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import TopologySpec
from dynamiccl.policy.sim.simulator import Config, Simulator
from dynamiccl.testing.nccl_player import nccl_pick
from dynamiccl.testing.workload import (
    IGNORE,
    STEP,
    Jitter,
    Op,
    TimeTable,
    build_time_table,
    call_key,
    calls_per_step,
    cfg_key,
    describe,
    step_buckets,
)


def test_every_call_of_the_step_divides_evenly_over_16_ranks() -> None:
    for op in STEP:
        assert op.nbytes % (16 * 4) == 0, op
    assert calls_per_step() == sum(op.repeat for op in STEP) == 7


def test_step_buckets_are_unique_and_ordered() -> None:
    cells = step_buckets()
    assert len(cells) == len(set(cells)) == 5
    assert cells[0] == (Collective.ALLREDUCE, 12)


def test_nccl_picks_from_the_cost_table_what_the_simulator_calls_its_default(
    times: TimeTable,
) -> None:
    for op in STEP:
        key = call_key(op.collective.nccl_id, op.nbytes)
        cost = times.cost[key]
        assert len(cost) == 7
        assert all(len(row) == 3 for row in cost)
        assert any(v != IGNORE for row in cost for v in row)
        algo, proto, _ = times.nccl_default[key]
        assert nccl_pick(cost) == (algo, proto)


def test_default_time_is_the_tabulated_time_of_nccls_pick(times: TimeTable) -> None:
    for op in STEP:
        c, n = op.collective.nccl_id, op.nbytes
        a, p, nch = times.nccl_default[call_key(c, n)]
        assert times.time_us(c, n, a, p, 0, 0) == pytest.approx(
            times.nccl_default_us[call_key(c, n)]
        )
        # naming NCCL's own channel count explicitly is the same configuration
        assert times.time_us(c, n, a, p, nch, 0) == times.time_us(c, n, a, p, 0, 0)


def test_table_times_match_the_simulator(spec: TopologySpec, times: TimeTable) -> None:
    sim = Simulator(spec)
    op = STEP[1]
    cfg = Config(algo=Algo.RING, proto=Proto.LL128, nchannels=8)
    want = sim.predict(op.collective, op.nbytes, cfg).time_us
    got = times.time_us(op.collective.nccl_id, op.nbytes, 1, 1, 8, 0)
    assert got == pytest.approx(want, rel=1e-9)


def test_unavailable_or_unknown_configurations_have_no_time(times: TimeTable) -> None:
    op = STEP[1]  # all-gather: NVLS/Tree unavailable on this fabric
    assert times.cost[call_key(op.collective.nccl_id, op.nbytes)][0] == [IGNORE] * 3
    assert times.time_us(op.collective.nccl_id, op.nbytes, 0, 0, 0, 0) is None
    assert times.time_us(op.collective.nccl_id, 999, 1, 0, 0, 0) is None
    assert times.time_us(op.collective.nccl_id, op.nbytes, 1, 0, 7, 0) is None  # 7 is no option


def test_only_simple_has_chunk_variants(times: TimeTable) -> None:
    op = STEP[4]
    c, n = op.collective.nccl_id, op.nbytes
    assert cfg_key(c, n, 1, 2, 0, 1 << 20) in times.mean_us
    assert cfg_key(c, n, 1, 1, 0, 1 << 20) not in times.mean_us


def test_the_fabric_makes_ll_slow_where_docs_say_so(times: TimeTable) -> None:
    """The simulator's `efa-ll` departure: LL128 beats NCCL's LL pick at 160 KiB all-reduce."""
    op = next(o for o in STEP if o.nbytes == 160 * 1024)
    c, n = op.collective.nccl_id, op.nbytes
    default = times.nccl_default_us[call_key(c, n)]
    ll128 = times.time_us(c, n, 0, 1, 0, 0)
    assert ll128 is not None
    assert default / ll128 > 1.3


def test_round_trip(tmp_path: Path, times: TimeTable) -> None:
    times.write(tmp_path / "t.json")
    assert TimeTable.read(tmp_path / "t.json") == times


def test_jitter_is_rank_identical_and_mean_preserving() -> None:
    a, b = Jitter(5), Jitter(5)
    xs = [a() for _ in range(20_000)]
    assert xs == [b() for _ in range(20_000)]
    assert statistics.fmean(xs) == pytest.approx(1.0, abs=0.002)
    assert statistics.pstdev(math.log(x) for x in xs) == pytest.approx(0.03, rel=0.05)
    assert Jitter(6)() != Jitter(5)()


def test_a_custom_step_is_tabulated(spec: TopologySpec) -> None:
    step = (Op(Collective.BROADCAST, 4096, 1, "x"),)
    t = build_time_table(spec, step)
    assert set(t.cost) == {call_key(0, 4096)}
    assert "broadcast of 4096 bytes" in describe(step)

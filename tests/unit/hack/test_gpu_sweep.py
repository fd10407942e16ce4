"""hack/gpu_sweep.py without a GPU: the epoch plan, and the whole sweep driver end to end with
exactly one stand-in, for NCCL on a GPU (fake_sweep_worker.py: plays NCCL against the real .so
and writes NCCL 2.30.7-format INFO lines; see its docstring)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dynamiccl.policy.sim.surface import parse_surface
from dynamiccl.testing import scripts
from dynamiccl.testing.nccl_player import default_so

gpu_sweep = scripts.load("gpu_sweep")
gpu_test = scripts.load("gpu_test")

ROOT = Path(__file__).resolve().parents[3]


def test_plan_boundaries_are_interval_multiples_with_margins() -> None:
    segs = gpu_sweep.plan(gpu_sweep.configs(), [4096, 1 << 20])
    assert segs[0].cfg is None
    assert segs[0].start == 0
    assert len(segs) - 1 == len(gpu_sweep.configs()) <= 63  # one epoch each, NCCL's file limit
    prev_end = segs[0].calls
    for s in segs[1:]:
        assert s.boundary % gpu_sweep.INTERVAL == 0
        assert s.boundary >= prev_end + gpu_sweep.MARGIN
        assert s.start == s.boundary + gpu_sweep.MARGIN
        prev_end = s.start + s.calls


def test_each_protocol_stops_at_its_largest_size() -> None:
    """LL all-gathers of 256 MiB over sockets outlasted the first real run's deadline."""
    segs = gpu_sweep.plan(gpu_sweep.configs(), list(gpu_sweep.SIZES))
    assert segs[0].sizes == gpu_sweep.SIZES  # NCCL's own choice: every size
    for s in segs[1:]:
        cap = gpu_sweep.MAX_BYTES[s.cfg.proto]
        assert s.sizes == tuple(n for n in gpu_sweep.SIZES if n <= cap)
        assert s.calls == gpu_sweep._calls(s.cfg.collectives, s.sizes)
    assert max(s.sizes[-1] for s in segs if s.cfg and s.cfg.proto == "ll") == 4 << 20


def test_iterations_shrink_with_size() -> None:
    its = [gpu_sweep.iters_for(n) for n in gpu_sweep.SIZES]
    assert its == sorted(its, reverse=True)
    assert its[0] == 20
    assert its[-1] == 3


@pytest.mark.parametrize("world", [2])
def test_whole_sweep_with_a_stand_in_for_nccl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world: int
) -> None:
    so_path = default_so()
    if not so_path.exists():
        subprocess.run(["make", "-s", "-C", str(ROOT / "plugin")], check=True)
    monkeypatch.setattr(gpu_sweep, "WORKER", Path(__file__).with_name("fake_sweep_worker.py"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    sizes = [4096, 1 << 20]
    rep = gpu_sweep.run_world(world, 1, sizes, so_path, tmp_path)
    assert rep["nccl_version"] == "2.30.7+cuda13.0"
    assert rep["tuner"] == {"name": "dynamiccl", "abi": 6}
    assert rep["nnodes_seen"] == [world]  # every rank its own node (NCCL_HOSTID)
    assert rep["plugin_mapped"]
    assert rep["mixed"] == []
    assert rep["unlogged"] == []
    # every forced point either ran as forced or NCCL's cost table ruled it out
    assert rep["forced_points_tried"] == sum(
        len(c.collectives) * len(sizes) for c in gpu_sweep.configs()
    )
    assert rep["forced_points_confirmed"] > 0
    assert rep["channels_differ"] == []
    ring = rep["profiler_ring"]
    assert ring["pushed"] + ring["dropped"] == world * rep["calls_per_rank"]  # one per call
    assert ring["without_timestamps"] == 0
    forced = parse_surface((tmp_path / f"surface-{world}.csv").read_text())
    own = parse_surface((tmp_path / f"nccl-pick-{world}.csv").read_text())
    assert len(forced.rows) == rep["forced_points_confirmed"]
    assert len(own.rows) == 3 * len(sizes)
    # the model makes ring/SIMPLE on 1 channel fastest from 1 MiB: found, outside the noise
    big = [x for x in rep["nccl_losses"] if x["nbytes"] >= 1 << 20]
    assert {x["collective"] for x in big} == {"allreduce", "allgather", "reducescatter"}
    assert all(x["best"] == "ring/simple/1" and x["outside_noise"] for x in big)
    # and tree (algo 0: the model's factor 1.0 against ring's 1.1) beats NCCL's ring at 4 KiB
    small = [
        (x["collective"], x["best"].split("/")[0])
        for x in rep["nccl_losses"]
        if x["nbytes"] == 4096
    ]
    assert small == [("allreduce", "tree")]
    assert (
        tuple((tmp_path / "surface-2.csv").read_text().split("\n")[0].split(",")) == gpu_test.HEADER
    )


def test_a_sweep_stopped_at_its_deadline_keeps_the_finished_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_sweep, "WORKER", Path(__file__).with_name("fake_sweep_worker.py"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("FAKE_STALL_AFTER", "2")  # NCCL's own segment and one configuration
    rep = gpu_sweep.run_world(2, 1, [4096], default_so(), tmp_path, deadline_s=8.0)
    assert not rep["complete"]
    assert rep["segments_done"] == 2
    assert rep["segments_planned"] == len(gpu_sweep.configs()) + 1
    first = gpu_sweep.configs()[0]
    assert rep["forced_points_tried"] == len(first.collectives)
    own = parse_surface((tmp_path / "nccl-pick-2.csv").read_text())
    assert len(own.rows) == 3

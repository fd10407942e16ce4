"""A measured surface with holes and NCCL's measured pick: only measured rows are offered,
NCCL's pick is the arm of what NCCL ran, and the tuner finds real NCCL's departure on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.eval.bench_tune import Arm, tune_bucket
from dynamiccl.policy.eval.measured_surface import load_measured, measured
from dynamiccl.policy.online.tuner_config import TunerConfig
from dynamiccl.policy.sim.surface import SurfaceError, parse_surface

HEAD = "collective,nbytes,algo,proto,nchannels,time_us,stddev_us\n"
RUN = Path(__file__).resolve().parents[4] / "benchmarks" / "gpu" / "2026-11-28-h200"
AR = Collective.ALLREDUCE


def _surface(rows: str) -> str:
    return HEAD + rows


def test_only_measured_rows_are_offered_and_the_pick_is_at_nccls_own_count() -> None:
    surface = parse_surface(
        _surface(
            "allreduce,1024,ring,simple,,10.0,0.1\n"
            "allreduce,1024,ring,simple,1,12.0,0.1\n"
            "allreduce,1024,tree,simple,,8.0,0.1\n"
        )
    )
    picks = parse_surface(_surface("allreduce,1024,ring,simple,2,10.2,0.1\n"))
    ms = measured(surface, picks)
    arms = ms.buckets[(AR, 1024)]
    assert [(a.algo, a.proto, a.nchannels, a.time_us) for a in arms] == [
        (Algo.RING, Proto.SIMPLE, None, 10.0),
        (Algo.RING, Proto.SIMPLE, 1, 12.0),
        (Algo.TREE, Proto.SIMPLE, None, 8.0),
    ]  # no LL, no other channel count: what was not measured is not there
    assert ms.pick()(AR, 1024, arms) == 0  # its pair at NCCL's own count, not its log's "2"


def test_the_pick_falls_back_to_its_channel_count_then_to_its_own_row() -> None:
    surface = parse_surface(
        _surface("allreduce,1024,ring,simple,2,10.0,0.1\nallgather,1024,ring,simple,,5.0,0.1\n")
    )
    picks = parse_surface(
        _surface("allreduce,1024,ring,simple,2,10.3,0.2\nallgather,1024,ring,ll,1,4.0,0.3\n")
    )
    ms = measured(surface, picks)
    assert ms.pick()(AR, 1024, ms.buckets[(AR, 1024)]) == 0
    gathered = ms.buckets[(Collective.ALLGATHER, 1024)]
    # NCCL ran ring/LL, which the sweep did not force: its own measured row joins the bucket
    assert gathered[-1] == Arm(Algo.RING, Proto.LL, None, 4.0, 0.3)
    assert ms.pick()(Collective.ALLGATHER, 1024, gathered) == len(gathered) - 1


def test_buckets_without_a_pick_have_no_default_and_stray_picks_are_named() -> None:
    surface = parse_surface(_surface("allreduce,1024,ring,simple,,10.0,0.1\n"))
    picks = parse_surface(_surface("allreduce,4096,ring,simple,,11.0,0.1\n"))
    ms = measured(surface, picks)
    assert ms.pick()(AR, 1024, ms.buckets[(AR, 1024)]) is None
    assert ms.unused_picks == ((AR, 4096),)
    assert (AR, 4096) not in ms.buckets


def test_two_picks_for_one_bucket_are_refused() -> None:
    surface = parse_surface(_surface("allreduce,1024,ring,simple,,10.0,0.1\n"))
    picks = parse_surface(
        _surface("allreduce,1024,ring,simple,,11.0,0.1\nallreduce,1024,ring,ll,,9.0,0.1\n")
    )
    with pytest.raises(SurfaceError, match="two rows for allreduce 1024"):
        measured(surface, picks)


def test_a_bad_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "picks.csv"
    bad.write_text(HEAD + "allreduce,1024,ring,simple,,-1,0.1\n")
    with pytest.raises(SurfaceError, match=r"picks\.csv: line 2: time_us"):
        load_measured(RUN / "surface-2.csv", bad)


def test_the_real_run_loads_whole_and_its_picks_are_what_nccl_ran() -> None:
    ms = load_measured(RUN / "surface-2.csv", RUN / "nccl-pick-2.csv")
    assert sum(len(v) for v in ms.buckets.values()) == 172  # every confirmed point, no more
    assert len(ms.picks) == 27
    assert not ms.unused_picks
    big = ms.buckets[(AR, 256 << 20)]
    pick = big[ms.pick()(AR, 256 << 20, big) or 0]
    assert (pick.algo, pick.proto, pick.nchannels) == (Algo.RING, Proto.SIMPLE, None)
    assert not any(a.proto is Proto.LL128 for arms in ms.buckets.values() for a in arms)


def test_the_tuner_finds_tree_simple_where_real_nccl_runs_ring() -> None:
    """The product's tuner (bench tune's, the sidecar's race) on the measured 256 MiB
    all-reduce: it ends on tree/SIMPLE, 22 % faster than NCCL's measured ring/SIMPLE, with
    a flat prior (no hint from the policy). The measured rows stand in for NCCL."""
    ms = load_measured(RUN / "surface-2.csv", RUN / "nccl-pick-2.csv")
    arms = ms.buckets[(AR, 256 << 20)]
    res = tune_bucket(
        AR, 256 << 20, arms, lambda _c, _n, a: [0.0] * len(a), ms.pick(),
        budget=200, seed=0, cfg=TunerConfig(), max_candidates=8, nranks=2, nnodes=2,
    )  # fmt: skip
    assert (res.chosen.algo, res.chosen.proto) == (Algo.TREE, Proto.SIMPLE)
    assert res.nccl_default is not None
    assert res.nccl_default.time_us / res.chosen.time_us > 1.25

"""Per-bucket rows from stored experience, the summary's geometric mean, table, report, plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.rewards import ExperienceRow, RewardRecord
from dynamiccl.demo.report import (
    DemoSummary,
    ModelInfo,
    RunInfo,
    bucket_rows,
    config_name,
    geomean,
    markdown,
    plot,
    table_lines,
)
from dynamiccl.testing.workload import STEP, TimeTable, call_key


def _row(  # noqa: PLR0917
    i: int, op_index: int, mean: float, count: int, algo: str, proto: str, **kw: Any
) -> ExperienceRow:
    op = STEP[op_index]
    rec = RewardRecord.model_validate(
        {
            "collective": op.collective.value,
            "size_bucket": op.nbytes.bit_length() - 1,
            "nbytes_min": op.nbytes,
            "nbytes_max": op.nbytes,
            "nranks": kw.get("nranks", 16),
            "nnodes": 2,
            "algo": algo,
            "proto": proto,
            "nchannels": 0,
            "chunk_bytes": 0,
            "origin": kw.get("origin", "table"),
            "count": count,
            "mean_time_us": mean,
            "p50_time_us": mean,
            "p99_time_us": mean,
            "busbw_GBps": 1.0,
            "nccl_default_time_us": 100.0,
        }
    )
    return ExperienceRow(
        id=i,
        namespace="ns",
        job_kind="PyTorchJob",
        job_name="j",
        job_uid="u",
        pod_uid="p",
        model_version="v",
        table_version=1,
        received_unix_s=0.0,
        record=rec,
    )


def test_rows_are_count_weighted_means_per_bucket(times: TimeTable) -> None:
    run1 = [_row(1, 0, 120.0, 30, "tree", "ll"), _row(2, 0, 90.0, 10, "tree", "ll128")]
    run2 = [_row(3, 0, 96.0, 40, "tree", "ll128"), _row(4, 0, 1.0, 1000, "tree", "ll", nranks=8)]
    rows = bucket_rows(STEP, times, [run1, run2])
    assert (rows[0].collective, rows[0].size_bucket) == (Collective.ALLREDUCE, 12)
    first = rows[0]
    default = times.nccl_default_us[call_key(4, 6144)]
    assert first.nccl_default_us == pytest.approx(default)
    assert first.run_us[0] == pytest.approx((120 * 30 + 90 * 10) / 40)
    assert first.run_us[1] == pytest.approx(
        96.0
    )  # the 8-rank communicator's record is not this job's world
    assert first.speedup[1] == pytest.approx(default / 96.0)
    assert first.choice == ["tree/ll", "tree/ll128"]
    assert first.calls == [40, 40]
    assert rows[1].run_us == [None, None]
    assert rows[1].speedup == [None, None]


def test_geomean_ignores_unknowns() -> None:
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([None, 4.0, 1.0]) == pytest.approx(2.0)
    assert geomean([]) == 0.0


def test_config_names() -> None:
    assert config_name(Algo.RING, Proto.LL128, 0, 0) == "ring/ll128"
    assert config_name(Algo.RING, Proto.SIMPLE, 16, 512 * 1024) == "ring/simple/16ch/512k"


def _summary(times: TimeTable, tmp_path: Path) -> DemoSummary:
    rows = bucket_rows(
        STEP,
        times,
        [[_row(1, 0, 110.0, 10, "tree", "ll")], [_row(2, 0, 98.0, 10, "tree", "ll128")]],
    )
    run = RunInfo(
        job_uid="u",
        model_version="default",
        canary=False,
        calls_per_rank=7,
        ranks=16,
        seconds=1.0,
        rewards_sent=1,
        reward_batches=1,
        tables_committed=1,
    )
    return DemoSummary(
        speedup_geomean=geomean([r.speedup[1] for r in rows]),
        speedup_geomean_run1=geomean([r.speedup[0] for r in rows]),
        rewards_sent=2,
        rewards_ingested=2,
        model_versions=["default", "v2"],
        models=[ModelInfo(version="default", status="promoted", sha256="0" * 64, parent=None)],
        buckets=rows,
        runs=[run, run.model_copy(update={"model_version": "v2", "canary": True})],
        canary="waiting",
        topology="aws-p5-2node",
        job="PyTorchJob j",
        policy="ml-learned",
        out_dir=str(tmp_path),
        plot=str(tmp_path / "demo.png"),
        report=str(tmp_path / "r.md"),
        seconds=3.0,
        fast=True,
    )


def test_table_markdown_and_plot(times: TimeTable, tmp_path: Path) -> None:
    s = _summary(times, tmp_path)
    lines = table_lines(s)
    assert lines[0][0] == "collective"
    assert len(lines) == 1 + len(s.buckets)
    assert lines[1][1] == "6 KiB"
    assert lines[1][8] == "tree/ll128"
    assert lines[2][4] == "-"  # no measurement in that bucket
    md = markdown(s, "- step", {"extra": "x"})
    assert "| collective |" in md
    assert f"{s.speedup_geomean:.3f}x" in md
    assert "(canary)" in md
    plot(s, Path(s.plot))
    data = Path(s.plot).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000

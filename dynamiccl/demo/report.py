"""The demo's results: per-bucket rows from the experience store, the summary, table, plot, report.

Measured times come from what the sidecars reported through the ingest into
the experience store (count-weighted means of the reward records of each
run's job, every call counted: the first calls before the job's table takes
effect, exploration and all); NCCL's default is the simulator's time of NCCL's own choice for
the same calls (`TimeTable.nccl_default_us`), the baseline the plugin and
policy must beat. Speedup = NCCL-default time / measured time, per
(collective, size bucket); `speedup_geomean` is the geometric mean over the
step's buckets for the second run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.rewards import ExperienceRow
from dynamiccl.api.table import size_bucket
from dynamiccl.testing.workload import Op, TimeTable, call_key


class BucketRow(BaseModel):
    """One (collective, size bucket) of the job's step."""

    model_config = ConfigDict(extra="forbid")

    collective: Collective
    size_bucket: int
    nbytes: list[int]
    nccl_default: str  # NCCL's own configuration
    nccl_default_us: float
    run_us: list[float | None]  # measured mean per run
    speedup: list[float | None]  # per run
    choice: list[str]  # most used configuration per run
    calls: list[int]  # collective calls measured per run (all ranks)


class RunInfo(BaseModel):
    """One run of the job."""

    model_config = ConfigDict(extra="forbid")

    job_uid: str
    model_version: str
    canary: bool
    calls_per_rank: int
    ranks: int
    seconds: float
    rewards_sent: int
    reward_batches: int
    tables_committed: int  # tables every sidecar saw agreed (the first is the job's initial one)


class ModelInfo(BaseModel):
    """A registered model version."""

    model_config = ConfigDict(extra="forbid")

    version: str
    status: str
    sha256: str
    parent: str | None


class DemoSummary(BaseModel):
    """What `dynamiccl demo --json` prints."""

    model_config = ConfigDict(extra="forbid")

    speedup_geomean: float  # second run vs NCCL's default, geometric mean over buckets
    speedup_geomean_run1: float
    rewards_sent: int
    rewards_ingested: int
    model_versions: list[str]
    models: list[ModelInfo]
    buckets: list[BucketRow]
    runs: list[RunInfo]
    canary: str
    topology: str
    job: str
    policy: str
    out_dir: str
    plot: str
    report: str
    seconds: float
    fast: bool


def config_name(algo: Algo, proto: Proto, nchannels: int, chunk: int) -> str:
    """`ring/ll128`, plus `/16ch` and `/512k` when not NCCL's own."""
    out = f"{algo.value}/{proto.value}"
    if nchannels:
        out += f"/{nchannels}ch"
    if chunk:
        out += f"/{chunk // 1024}k"
    return out


def _default_name(t: TimeTable, op: Op) -> str:
    a, p, _ = t.nccl_default[call_key(op.collective.nccl_id, op.nbytes)]
    return config_name(list(Algo)[a], list(Proto)[p], 0, 0)


def bucket_rows(
    step: Sequence[Op], times: TimeTable, runs: Sequence[Sequence[ExperienceRow]]
) -> list[BucketRow]:
    """Rows per (collective, bucket) of the step, from each run's stored experience."""
    groups: dict[tuple[Collective, int], list[Op]] = defaultdict(list)
    for op in step:
        groups[(op.collective, size_bucket(op.nbytes))].append(op)
    out = []
    for (coll, bucket), ops in groups.items():
        weight = sum(op.repeat for op in ops)
        default_us = (
            sum(times.nccl_default_us[call_key(coll.nccl_id, op.nbytes)] * op.repeat for op in ops)
            / weight
        )
        row = BucketRow(
            collective=coll,
            size_bucket=bucket,
            nbytes=sorted({op.nbytes for op in ops}),
            nccl_default=_default_name(times, ops[0]),
            nccl_default_us=default_us,
            run_us=[],
            speedup=[],
            choice=[],
            calls=[],
        )
        for rows in runs:
            mine = [
                r.record
                for r in rows
                if r.record.collective == coll
                and r.record.size_bucket == bucket
                and r.record.nranks == times.nranks
            ]
            calls = sum(r.count for r in mine)
            total = sum(r.count * r.mean_time_us for r in mine)
            mean = total / calls if calls else None
            by_cfg: dict[str, int] = defaultdict(int)
            for r in mine:
                by_cfg[config_name(r.algo, r.proto, r.nchannels, r.chunk_bytes)] += r.count
            row.run_us.append(mean)
            row.speedup.append(default_us / mean if mean else None)
            row.choice.append(max(by_cfg, key=lambda k: by_cfg[k]) if by_cfg else "-")
            row.calls.append(calls)
        out.append(row)
    return out


def geomean(values: Sequence[float | None]) -> float:
    """Geometric mean of the known values (0.0 when none is known)."""
    known = [v for v in values if v is not None and v > 0]
    if not known:
        return 0.0
    return math.exp(sum(math.log(v) for v in known) / len(known))


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def table_lines(s: DemoSummary) -> list[list[str]]:
    """The per-bucket table as rows of strings (header first)."""
    head = ["collective", "size", "NCCL's pick", "NCCL us", "run 1 us", "run 2 us"]
    head += ["run 1", "run 2", "run 2 mostly"]
    lines = [head]
    for b in s.buckets:

        def us(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        def sp(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}x"

        lines.append(
            [
                b.collective.value,
                ", ".join(_size(n) for n in b.nbytes),
                b.nccl_default,
                f"{b.nccl_default_us:.1f}",
                us(b.run_us[0] if b.run_us else None),
                us(b.run_us[1] if len(b.run_us) > 1 else None),
                sp(b.speedup[0] if b.speedup else None),
                sp(b.speedup[1] if len(b.speedup) > 1 else None),
                b.choice[1] if len(b.choice) > 1 else "-",
            ]
        )
    return lines


def markdown(s: DemoSummary, step_text: str, details: dict[str, Any]) -> str:
    """The report written to the output directory."""
    rows = table_lines(s)
    md = ["# DynamICCL demo report", ""]
    md.append(
        f"Job `{s.job}` (16 ranks) on the simulated cluster `{s.topology}`, policy `{s.policy}`. "
        f"Run 1 used model `{s.runs[0].model_version}`; after one retraining, run 2 used "
        f"`{s.runs[-1].model_version}`{' (canary)' if s.runs[-1].canary else ''}."
    )
    md += ["", "**Speedup vs NCCL's default, run 2 (geometric mean over buckets): "]
    md[-1] += f"{s.speedup_geomean:.3f}x** (run 1: {s.speedup_geomean_run1:.3f}x)"
    md += ["", "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    md += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    md += ["", "![per-bucket times](demo.png)", "", "## The job's training step", "", step_text]
    md += ["", "## The loop", ""]
    md += [
        f"- rewards sent by the sidecars: {s.rewards_sent}; stored by the ingest: "
        f"{s.rewards_ingested}",
        f"- model versions: {', '.join(s.model_versions)}",
        f"- canary: {s.canary}",
    ]
    for r in s.runs:
        md.append(
            f"- run with model `{r.model_version}`: job uid `{r.job_uid}`, "
            f"{r.calls_per_rank} collective calls per rank x {r.ranks} ranks, "
            f"{r.tables_committed} tables agreed by every sidecar, "
            f"{r.reward_batches} reward batches, {r.seconds:.1f} s"
        )
    for key, value in details.items():
        md.append(f"- {key}: {value}")
    md += ["", f"Everything took {s.seconds:.0f} s. Files: `{s.out_dir}`.", ""]
    return "\n".join(md)


def plot(s: DemoSummary, path: Path) -> None:
    """Per bucket: mean time per call (left) and speedup vs NCCL's default (right); PNG."""
    import matplotlib  # noqa: PLC0415 - heavy, only for the report

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    labels = [f"{b.collective.value}\n{_size(b.nbytes[0])}" for b in s.buckets]
    nruns = max((len(b.run_us) for b in s.buckets), default=0)
    blues = ("#64b5f6", "#1565c0", "#0d47a1")
    times = [("NCCL's default", [b.nccl_default_us for b in s.buckets], "#9e9e9e")]
    speed = []
    for k in range(nruns):
        name = f"DynamICCL run {k + 1}"
        times.append((name, [_at(b.run_us, k) for b in s.buckets], blues[k % 3]))
        speed.append((name, [_at(b.speedup, k) for b in s.buckets], blues[k % 3]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), dpi=110)
    _bars(left, labels, times)
    left.set_ylabel("mean time per collective call (us)")
    left.set_title("time per call, lower is better")
    _bars(right, labels, speed, annotate=True)
    right.axhline(1.0, color="#424242", linestyle="--", linewidth=1)
    right.set_ylabel("NCCL's default time / DynamICCL time")
    right.set_title("speedup vs NCCL's default, higher is better")
    fig.suptitle(
        f"{s.job}, 16 ranks on {s.topology} (simulated): run 2 geometric-mean speedup "
        f"{s.speedup_geomean:.2f}x"
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _at(values: Sequence[float | None], k: int) -> float:
    return float(values[k] or 0.0) if k < len(values) else 0.0


def _bars(ax: Any, labels: list[str], series: list[Any], *, annotate: bool = False) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (name, values, color) in enumerate(series):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        bars = ax.bar(xs, values, width, label=name, color=color)
        if annotate:
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=8, padding=2)
    ax.set_xticks(range(len(labels)), labels, fontsize=9)
    ax.legend(loc="upper left", fontsize=9)
    ax.grid(axis="y", alpha=0.3)

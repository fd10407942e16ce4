"""PNG plots of a suite report (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dynamiccl.policy.eval.suite import SuiteReport, TopologyResult


def _per_size(t: TopologyResult) -> tuple[list[int], dict[str, list[float]]]:
    """Geometric mean over collectives of each speedup vs NCCL, per size."""
    sizes = sorted({c.nbytes for c in t.calls})
    series: dict[str, list[float]] = {"oracle": [], "static": [], "tuned": []}

    def geo(vals: list[float]) -> float:
        return float(np.exp(np.mean(np.log(vals))))

    for n in sizes:
        rows = [c for c in t.calls if c.nbytes == n]
        series["oracle"].append(geo([c.nccl_us / c.oracle_us for c in rows]))
        series["static"].append(geo([c.nccl_us / c.static_us for c in rows]))
        if all(c.tuned_us for c in rows):
            series["tuned"].append(geo([c.nccl_us / (c.tuned_us or 1.0) for c in rows]))
    return sizes, series


def plot_all(report: SuiteReport, out: Path) -> list[Path]:
    """Write suite_speedup.png and suite_summary.png into `out`; returns the paths."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    n = len(report.topologies)
    cols = 4
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), sharex=True)
    for ax, t in zip(np.ravel(axes), report.topologies, strict=False):
        sizes, s = _per_size(t)
        x = np.log2(sizes)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.plot(x, s["oracle"], "k--", lw=1.2, label="oracle")
        ax.plot(x, s["static"], "C0-", lw=1.2, label="policy (static)")
        if s["tuned"]:
            ax.plot(x, s["tuned"], "C1-", lw=1.0, label="policy + online tuner")
        ax.set_title(t.name, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in np.ravel(axes)[n:]:
        ax.axis("off")
    for ax in np.ravel(axes)[-cols:]:
        ax.set_xlabel("log2(bytes)", fontsize=8)
    np.ravel(axes)[0].legend(fontsize=7)
    fig.suptitle("Speedup over NCCL's default (geometric mean over the 5 collectives)")
    fig.tight_layout()
    p = out / "suite_speedup.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(11, 4))
    names = [t.name for t in report.topologies]
    x = np.arange(len(names))
    static = [t.static.speedup for t in report.topologies]
    tuned = [t.tuned.speedup if t.tuned else float("nan") for t in report.topologies]
    ax.bar(x - 0.2, static, 0.4, label="policy (static)")
    ax.bar(x + 0.2, tuned, 0.4, label="policy + online tuner")
    frac = [(t.tuned or t.static).oracle_fraction for t in report.topologies]
    ax2 = ax.twinx()
    ax2.plot(x, [f * 100 for f in frac], "kD", label="% of oracle")
    ax2.set_ylim(90, 100.5)
    ax2.set_ylabel("% of oracle")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("geomean speedup vs NCCL")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    p = out / "suite_summary.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths

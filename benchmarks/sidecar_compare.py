"""`sidecar_bench.py --compare TREE`: this checkout's sidecar against another's, in one run.

At each rate, this checkout's sidecar and TREE's alternate `repeats` times, each
run in a fresh interpreter (`sidecar_bench.py --run-one`) whose `dynamiccl`
(sidecar, shared-memory layout, feeder's record layout) is that tree's. Each
row: the best CPU microseconds per record read (idle loop included) of each
tree, every run's, and the ratio this / compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BENCH = HERE / "sidecar_bench.py"


class NoRecordsReadError(RuntimeError):
    """A run's window read no record: no per-record figure exists (say so, never divide)."""


def per_record_us(row: dict[str, Any]) -> float:
    """The sidecar's CPU microseconds per record read (its idle loop included)."""
    if row["records_per_s_read"] <= 0:
        raise NoRecordsReadError(
            f"at {row['rate']}/s the sidecar read no record in the measured window (the "
            "machine too loaded for this duration?): run longer (--duration) or on fewer loads"
        )
    return float(row["cpu_core_fraction"] / row["records_per_s_read"] * 1e6)


def compare_rows(a: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    """This checkout's sidecar against `a.compare`'s, alternated, per rate (`--compare`)."""
    trees = {"this": str(ROOT), "compare": a.compare}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(a.repeats):
        for name, tree in trees.items():
            out = subprocess.run(
                [sys.executable, str(BENCH), "--run-one", a.rates,
                 str(a.duration), str(a.warmup), url],
                env={**os.environ, "PYTHONPATH": tree, "SIDECAR_BENCH_TREE": tree},
                cwd=tree, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[name].extend(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for rate in sorted({r["rate"] for r in runs["this"]}):
        best = {n: min(per_record_us(r) for r in runs[n] if r["rate"] == rate) for n in trees}
        every = {
            n: [round(per_record_us(r), 2) for r in runs[n] if r["rate"] == rate] for n in trees
        }
        rows.append({"rate": rate, "us_per_record": best, "runs": every,
                     "ratio_this_vs_compare": best["this"] / best["compare"]})  # fmt: skip
    return rows


def print_compare(rows: list[dict[str, Any]], repeats: int) -> None:
    """The text report of `compare_rows`."""
    for r in rows:
        b = r["us_per_record"]
        print(
            f"at {r['rate']:.0f}/s: this {b['this']:.2f} us, compare {b['compare']:.2f} us CPU "
            f"per record read (best of {repeats}; runs {r['runs']}); "
            f"ratio {r['ratio_this_vs_compare']:.3f}"
        )

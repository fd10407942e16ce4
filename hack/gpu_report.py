"""hack/gpu_run.sh's last step: one summary of the GPU run (summary.json, report.md) under $OUT.

Reads what the steps left in the work folder (facts.json, sweep-N/report.json, ddp-N.json) and
copies the surfaces (surface-N.csv, nccl-pick-N.csv). A step that did not finish is named
as missing, never filled in.

usage: python hack/gpu_report.py --work DIR --out DIR --command TEXT
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def collect(work: Path, command: str) -> dict[str, Any]:
    """Everything the run measured, by step; `missing` lists the steps with no result."""
    out: dict[str, Any] = {"command": command, "facts": _load(work / "facts.json")}
    missing = []
    for n in (2, 4):
        sweep = _load(work / f"sweep-{n}" / "report.json")
        ddp = _load(work / f"ddp-{n}.json")
        out[f"sweep_{n}"], out[f"ddp_{n}"] = sweep, ddp
        missing += [f"sweep {n} ranks"] * (sweep is None) + [f"ddp {n} ranks"] * (ddp is None)
    out["missing"] = missing
    return out


def _sweep_md(n: int, rep: Mapping[str, Any]) -> list[str]:
    lines = [
        f"## Surface, {n} ranks",
        f"NCCL {rep['nccl_version']}; tuner {rep['tuner']}, profiler {rep['profiler']}; "
        f"nNodes seen {rep['nnodes_seen']}; network {rep['network']}; "
        f"{rep['coll_channels']} coll channels.",
        f"Forced points confirmed: {rep['forced_points_confirmed']} of "
        f"{rep['forced_points_tried']} (ruled out by NCCL {len(rep['ruled_out'])}, channel "
        f"count differs {len(rep['channels_differ'])}, mixed {len(rep['mixed'])}, "
        f"unlogged {len(rep['unlogged'])}). Profiler ring: {rep['profiler_ring']} for "
        f"{rep['calls_per_rank']} calls per rank. Chunk clamps seen: {rep['chunk_clamps']}. "
        f"Segments finished: {rep.get('segments_done')} of {rep.get('segments_planned')}.",
        "",
        "| collective | bytes | NCCL's pick | us | fastest | us | saving | z | outside noise |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in rep["nccl_losses"]:
        lines.append(
            f"| {x['collective']} | {x['nbytes']} | {x['nccl']} | {x['nccl_us']} | {x['best']} "
            f"| {x['best_us']} | {x['saving']:.1%} | {x['z']} | {x['outside_noise']} |"
        )
    return [*lines, ""]


def _ddp_md(n: int, rep: Mapping[str, Any]) -> list[str]:
    loop = rep.get("dynamiccl_loop") or {}
    lines = [f"## DDP, {n} ranks", "", "| run | step ms | sd | bucket us | buckets/step |"]
    lines.append("|---|---|---|---|---|")
    for mode in ("nccl", "tuner", "profiler", "dynamiccl"):
        s = rep.get(mode) or {}
        lines.append(
            f"| {mode} | {s.get('step_ms_mean')} | {s.get('step_ms_sd')} | "
            f"{s.get('bucket_us_mean')} | {s.get('buckets_per_step')} |"
        )
    side = loop.get("sidecars") or []
    explore = sum(int(s.get("exploration_calls", 0)) for s in side)
    cost = [s.get("exploration_cost_percent") for s in side]
    lines += [
        "",
        f"Profiler overhead (profiler vs tuner-only step time): {rep.get('profiler_overhead')}.",
        f"Operator: {loop.get('decision')} ({loop.get('table_cells')} table cells).",
        f"Tables agreed across pods: {loop.get('tables_agreed')}. Exploration calls {explore}, "
        f"cost % per sidecar {cost}. Reward: {loop.get('reward')}.",
        f"Seconds per run: {rep.get('seconds')}. Errors: {rep.get('errors') or 'none'}.",
        "",
    ]
    return lines


def markdown(s: Mapping[str, Any]) -> str:
    """report.md: the figures the issue's closing note needs."""
    lines = ["# GPU tier run", "", f"Command: `{s['command']}`", f"Facts: {s['facts']}", ""]
    for n in (2, 4):
        if s.get(f"sweep_{n}"):
            lines += _sweep_md(n, s[f"sweep_{n}"])
        if s.get(f"ddp_{n}"):
            lines += _ddp_md(n, s[f"ddp_{n}"])
    lines.append(f"Missing steps: {s['missing'] or 'none'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", default="")
    args = ap.parse_args(argv)
    s = collect(args.work, args.command)
    (args.out / "summary.json").write_text(json.dumps(s, indent=1, default=str))
    (args.out / "report.md").write_text(markdown(s))
    for n in (2, 4):
        for name in (f"surface-{n}.csv", f"nccl-pick-{n}.csv"):
            if (args.work / name).is_file():
                shutil.copy2(args.work / name, args.out / name)
    print(f"gpu-report: {args.out}/report.md; missing: {s['missing'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the real-node demo prints: one line per job, then what the sequence shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from dynamiccl.demo.real_sequence import RealJob

HEADER: Final = (
    f"{'job':>3}  {'model version':<44} {'measured':<8} {'off NVLS':<8} {'speedup':>7}  "
    f"{'explored':>8}  {'cost %':>6}  {'32 MiB off NVLS':>15}  {'s':>3}  "
    "found / what the loop did"
)


def format_row(r: RealJob) -> str:
    """`measured`: the cells its table took from the class's findings; `off NVLS`: its table's
    first choice for the 32 MiB all-reduce; `32 MiB off NVLS`: what its ranks ran."""
    model = r.model_version + (" (canary)" if r.canary else "")
    sp = "-" if r.speedup is None else f"{r.speedup:.3f}"
    off = "-" if r.off_nvls is None else f"{100 * r.off_nvls:.0f}%"
    notes = "; ".join([*r.found, *r.events])
    return (
        f"{r.index:>3}  {model:<44} {len(r.measured):<8} {'yes' if r.avoids else 'no':<8} "
        f"{sp:>7}  {r.explored_calls:>8}  {r.cost_percent:>6.3f}  {off:>15}  "
        f"{r.seconds:>3.0f}  {notes}"
    )


def _first(rows: Sequence[RealJob], pred: Any) -> int | None:
    return next((r.index for r in rows if pred(r)), None)


def every_job_from(rows: Sequence[RealJob]) -> int | None:
    """The first job from which every job's table starts with a finding (None: not reached)."""
    for i, r in enumerate(rows):
        if all(x.measured for x in rows[i:]):
            return r.index
    return None


def summary(
    rows: Sequence[RealJob], retrained: dict[str, Any], learning: dict[str, Any], wall_s: float
) -> dict[str, Any]:
    """What the sequence shows (printed, and written to summary.json)."""
    holds = _first(rows, lambda r: any(e.startswith("finding holds") for e in r.events))
    promoted = _first(rows, lambda r: any(e.startswith("promoted") for e in r.events))
    with_finding = [r for r in rows if r.measured]
    return {
        "found_at": _first(rows, lambda r: r.found),
        "finding_holds_after": holds,
        "every_job_from": every_job_from(rows),
        "parent_with_finding": _first(with_finding, lambda r: not r.canary),
        "adopted_at": _first(rows, lambda r: r.avoids),
        "promoted_after": promoted,
        "first_job_speedup": rows[0].speedup if rows else None,
        "with_finding_speedups": [r.speedup for r in with_finding],
        "max_cost_percent": max((r.cost_percent for r in rows), default=0.0),
        "retrain": retrained,
        "jobs": [asdict(r) for r in rows],
        "learning": learning,
        "wall_s": round(wall_s, 1),
    }


def summary_lines(s: dict[str, Any], budget: float) -> list[str]:
    sp = [x for x in s["with_finding_speedups"] if x]
    rt = s["retrain"]
    dash = "-"
    first = f"{s['first_job_speedup']:.3f}" if s["first_job_speedup"] else dash
    return [
        f"found by exploration: job {s['found_at'] or dash} (NVLS measured slower at 32 MiB)",
        f"finding holds (confirmed by another job): after job {s['finding_holds_after'] or dash}",
        f"every job starts with it from: job {s['every_job_from'] or dash} (a parent-model job "
        f"with it: job {s['parent_with_finding'] or dash})",
        f"speedups of the jobs that started with it: "
        f"{', '.join(f'{x:.3f}' for x in sp) or dash} (first job {first})",
        f"retrained: {rt.get('version', dash)} by the loop's Job on {rt.get('node', dash)} "
        f"({rt.get('image', dash)}), trigger to finished {rt.get('trigger_to_finished_s', dash)} s",
        f"promoted by the sequential judge: after job {s['promoted_after'] or dash}",
        f"largest exploration cost of a job: {s['max_cost_percent']:.3f} % (budget {budget:g} %)",
    ]

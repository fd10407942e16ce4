"""What `make demo-cluster` prints: one line per job, then what the sequence shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from dynamiccl.demo.surface import Departure

if TYPE_CHECKING:
    from dynamiccl.demo.kube_sequence import JobResult


HEADER: Final = (
    f"{'job':>3}  {'model version':<46} {'measured':<8} {'Tree':<4} {'speedup':>7}  "
    f"{'explored':>8}  {'cost %':>6}  {'s':>3}  found / what the loop did"
)


def format_row(r: JobResult, seconds: float) -> str:
    model = r.model_version + (" (canary)" if r.canary else "")
    sp = "-" if r.speedup is None else f"{r.speedup:.3f}"
    notes = "; ".join([*r.found, *r.events])
    return (
        f"{r.index:>3}  {model:<46} {len(r.measured):<8} {'yes' if r.runs_departure else 'no':<4} "
        f"{sp:>7}  "
        f"{r.explored_calls:>8}  {r.cost_percent:>6.3f}  {seconds:>3.0f}  {notes}"
    )


def found_of(status: dict[str, Any]) -> list[str]:
    """A TuningRun status's configurations measured >= 5 % faster than NCCL's, one line each."""
    ex = status.get("exploration") or {}
    return [
        f"{f['collective']} {1 << int(f['sizeBucket']) >> 20} MiB {f['algo']}/{f['proto']} "
        f"x{float(f['speedup']):.2f}"
        for f in ex.get("found") or []
        if float(f.get("speedup", 0)) > 1.05
    ]


@dataclass(frozen=True)
class Outcome:
    """What the sequence shows (the numbers `make demo-cluster` ends with)."""

    found_at: int | None  # first job whose exploration measured the departed algorithm faster
    adopted_at: int | None  # first job whose (retrained) table runs it
    every_job_from: int | None  # the first job from which every job's table has a finding
    promoted_at: int | None  # first job after which the loop promoted a retrained version
    max_cost_percent: float
    best_speedup: float | None  # of the jobs running a retrained version
    learning: dict[str, Any]

    def lines(self, departure: Departure | None) -> list[str]:
        name = (departure or Departure()).faster.value
        out = [
            f"found by exploration: job {self.found_at or '-'} ({name} measured faster)",
            f"adopted (a retrained model's table runs it): job {self.adopted_at or '-'}",
            f"every job starts with the class's finding from: job {self.every_job_from or '-'}",
            f"promoted by the sequential judge: after job {self.promoted_at or '-'}",
            f"largest exploration cost of a job: {self.max_cost_percent:.3f} % of its "
            "collective time (budget 1 %)",
            f"best speedup of a job on a retrained model: {self.best_speedup or '-'}",
        ]
        for hc in self.learning.get("hardwareClasses") or []:
            deps = ", ".join(
                f"{d['collective']} {1 << int(d['sizeBucket']) >> 20} MiB {d['algo']}/{d['proto']} "
                f"x{float(d['speedup']):.2f}{' adopted' if d.get('adopted') else ''}"
                for d in hc.get("departures") or []
            )
            out.append(
                f"class {hc['hardwareClass']}: {hc.get('cellsSettled', 0)} of "
                f"{hc.get('cellsMeasured', 0)} measured cells settled; departures: {deps or 'none'}"
            )
        return out


def outcome(rows: list[JobResult], learning: dict[str, Any], d: Departure | None) -> Outcome:
    name = (d or Departure()).faster.value
    found = [r.index for r in rows if any(f" {name}/" in f for f in r.found)]
    adopted = [r.index for r in rows if r.runs_departure and r.model_version != "default"]
    promoted = [r.index for r in rows if any(e.startswith("promoted") for e in r.events)]
    retrained = [r.speedup for r in rows if r.model_version != "default" and r.speedup]
    return Outcome(
        found_at=found[0] if found else None,
        adopted_at=adopted[0] if adopted else None,
        every_job_from=next(
            (r.index for i, r in enumerate(rows) if all(x.measured for x in rows[i:])), None
        ),
        promoted_at=promoted[0] if promoted else None,
        max_cost_percent=max((r.cost_percent for r in rows), default=0.0),
        best_speedup=round(max(retrained), 3) if retrained else None,
        learning=learning,
    )

"""Jobs in a row, wherever they run: one row per job, one line per row, what the row shows.

Three places play the demo's sequence of jobs: the harness-played cluster
(`sequence.py`: `dynamiccl demo`, the learning bench), the local control plane
on kwok nodes (`kube_sequence.py`) and the real node (`real_sequence.py`; both `make
demo-cluster`). Each runs a job its own way and reads what the cluster recorded of it
from the job's TuningRun (`from_tuning_run`); the row, its line, the story the rows tell
(`outcome`) and the loop over jobs (`play`) are this module's, once for all three.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from dynamiccl.api.table import DecisionTable
    from dynamiccl.demo.harness_job import Played

FOUND_OVER: Final = 1.05  # a configuration counts as found when measured this much faster
Rollout = tuple[str | None, str | None]  # (promoted version, canary version serving jobs)


@dataclass
class JobRow:
    """One job of a sequence, as its TuningRun (and the place that ran it) saw it."""

    index: int
    name: str
    model_version: str
    canary: bool
    runs_departure: bool = False  # its table's first choice in the departed cells is faster
    speedup: float | None = None  # NCCL-default time / measured time (the TuningRun's)
    explored_calls: int = 0
    cost_percent: float = 0.0
    found: list[dict[str, Any]] = field(default_factory=list)  # >= 5 % faster than NCCL's
    measured: list[str] = field(default_factory=list)  # its cells from the class's findings
    events: list[str] = field(default_factory=list)  # what the learning loop did after it
    seconds: float = 0.0  # the whole job at its place, learning after it included (`play`)
    ran_departure: float | None = None  # share of its departed calls its ranks ran faster
    played: Played | None = None  # a harness-played job's own figures
    leaves_nccl: bool = False  # its table leaves NCCL's own pair in some cell (harness)
    table: DecisionTable | None = None  # the table it started with (harness)


def from_tuning_run(index: int, name: str, run: dict[str, Any]) -> JobRow:
    """The row of a job from its TuningRun (spec and status)."""
    spec, st = run.get("spec") or {}, run.get("status") or {}
    ex = st.get("exploration") or {}
    return JobRow(
        index, name, str(spec.get("modelVersion", "")), bool(spec.get("canary")),
        speedup=(st.get("reward") or {}).get("speedup"),
        explored_calls=int(ex.get("exploratoryCalls", 0)),
        cost_percent=float(ex.get("costPercent", 0.0)),
        found=[f for f in ex.get("found") or [] if float(f.get("speedup", 0)) > FOUND_OVER],
        measured=[str(m) for m in spec.get("measuredCells") or []],
    )  # fmt: skip


def found_text(f: dict[str, Any]) -> str:
    """A found configuration (or a class's finding), one short phrase."""
    return (
        f"{f['collective']} {1 << int(f['sizeBucket']) >> 20} MiB {f['algo']}/{f['proto']} "
        f"x{float(f['speedup']):.2f}"
    )


def new_findings(learning: dict[str, Any], held: set[tuple[Any, ...]]) -> list[str]:
    """An event for each of the class's findings that holds in `learning` (a policy's
    `status.learning`) and was not in `held` (which it joins): docs/learning-loop.md."""
    out = []
    for hc in learning.get("hardwareClasses") or []:
        for f in hc.get("findings") or []:
            key = (hc.get("hardwareClass"), f["collective"], f["sizeBucket"], f["nranks"],
                   f["nnodes"], f["algo"], f["proto"], f.get("nchannels"))  # fmt: skip
            if f.get("holds") and key not in held:
                held.add(key)
                out.append(f"finding holds: {found_text(f)} ({f['supporting']} jobs)")
    return out


def rollout_of(learning: dict[str, Any]) -> Rollout:
    """The promoted version and the canary serving new jobs, from a policy's
    `status.learning`."""
    r = learning.get("rollout") or {}
    return r.get("promoted"), (r.get("canary") if r.get("canaryPercent") else None)


def rollout_events(learning: dict[str, Any], before: Rollout) -> tuple[list[str], Rollout]:
    """What changed in the rollout since `before`: a canary started, a version promoted, a
    canary ended without promotion; and the rollout now."""
    now = rollout_of(learning)
    events = []
    if now[1] and now[1] != before[1]:
        events.append(f"canary {now[1]}")
    if now[0] and now[0] != before[0]:
        events.append(f"promoted {now[0]}")
    if before[1] and not now[1] and now[0] != before[1]:
        events.append(f"canary {before[1]} ended")
    return events, now


HEADER: Final = (
    f"{'job':>3}  {'model version':<46} {'measured':<8} {'runs it':<7} {'speedup':>7}  "
    f"{'explored':>8}  {'cost %':>6}  {'ran it':>6}  {'s':>3}  found / what the loop did"
)


def format_row(r: JobRow) -> str:
    """`measured`: cells its table took from the class's findings; `runs it`: its table's
    first choice in the departed cells is the faster one; `ran it`: the share of its departed
    calls its ranks ran the faster way (where the place can tell)."""
    model = r.model_version + (" (canary)" if r.canary else "")
    sp = "-" if r.speedup is None else f"{r.speedup:.3f}"
    ran = "-" if r.ran_departure is None else f"{100 * r.ran_departure:.0f}%"
    notes = "; ".join([*(found_text(f) for f in r.found), *r.events])
    return (
        f"{r.index:>3}  {model:<46} {len(r.measured):<8} {'yes' if r.runs_departure else 'no':<7} "
        f"{sp:>7}  {r.explored_calls:>8}  {r.cost_percent:>6.3f}  {ran:>6}  {r.seconds:>3.0f}  "
        f"{notes}"
    )


def _first(rows: Sequence[JobRow], pred: Callable[[JobRow], bool]) -> int | None:
    return next((r.index for r in rows if pred(r)), None)


@dataclass(frozen=True)
class Outcome:
    """What a sequence shows (the lines the demo ends with)."""

    found_at: int | None  # first job whose exploration measured the faster way
    holds_after: int | None  # the job after which the class's finding held
    every_job_from: int | None  # the first job from which every job's table has a finding
    parent_with_finding: int | None  # the first job not on a canary that had it
    adopted_at: int | None  # the first job whose table runs the faster way
    promoted_after: int | None  # the first job after which the loop promoted a version
    first_speedup: float | None
    with_finding: list[float | None]  # speedups of the jobs that started with a finding
    max_cost_percent: float
    learning: dict[str, Any]

    def lines(self, faster: str, budget_percent: float) -> list[str]:
        dash = "-"
        sp = ", ".join(f"{x:.3f}" for x in self.with_finding if x) or dash
        first = f"{self.first_speedup:.3f}" if self.first_speedup else dash
        out = [
            f"found by exploration: job {self.found_at or dash} ({faster})",
            f"the class's finding holds (another job confirmed it): after job "
            f"{self.holds_after or dash}",
            f"every job starts with it from: job {self.every_job_from or dash} (a parent-model "
            f"job with it: job {self.parent_with_finding or dash})",
            f"a job's table runs it: from job {self.adopted_at or dash}",
            f"speedups of the jobs that started with it: {sp} (first job {first})",
            f"promoted by the sequential judge: after job {self.promoted_after or dash}",
            f"largest exploration cost of a job: {self.max_cost_percent:.3f} % of its "
            f"collective time (budget {budget_percent:g} %)",
        ]
        for hc in self.learning.get("hardwareClasses") or []:
            held = [found_text(f) for f in hc.get("findings") or [] if f.get("holds")]
            deps = [
                found_text(d) + (" adopted" if d.get("adopted") else "")
                for d in hc.get("departures") or []
            ]
            out.append(
                f"class {hc['hardwareClass']}: {hc.get('cellsSettled', 0)} of "
                f"{hc.get('cellsMeasured', 0)} measured cells settled; findings that hold: "
                f"{', '.join(held) or 'none'}; the models' departures: {', '.join(deps) or 'none'}"
            )
        return out


def outcome(
    rows: Sequence[JobRow],
    learning: dict[str, Any],
    wanted: Callable[[dict[str, Any]], bool] = lambda f: True,
) -> Outcome:
    """What `rows` show; `wanted`: which found configuration is the story's."""
    with_finding = [r for r in rows if r.measured]
    return Outcome(
        found_at=_first(rows, lambda r: any(wanted(f) for f in r.found)),
        holds_after=_first(rows, lambda r: any(e.startswith("finding holds") for e in r.events)),
        every_job_from=next(
            (r.index for i, r in enumerate(rows) if all(x.measured for x in rows[i:])), None
        ),
        parent_with_finding=_first(with_finding, lambda r: not r.canary),
        adopted_at=_first(rows, lambda r: r.runs_departure),
        promoted_after=_first(rows, lambda r: any(e.startswith("promoted") for e in r.events)),
        first_speedup=rows[0].speedup if rows else None,
        with_finding=[r.speedup for r in with_finding],
        max_cost_percent=max((r.cost_percent for r in rows), default=0.0),
        learning=learning,
    )


class Place(Protocol):
    """Where a sequence's jobs run."""

    def run_job(self) -> JobRow: ...

    def learning(self) -> dict[str, Any]: ...


def play(place: Place, jobs: int, echo: Callable[[str], None]) -> list[JobRow]:
    """`jobs` jobs in a row at `place`, one line each as it ends."""
    echo(HEADER)
    rows = []
    for _ in range(jobs):
        t0 = time.monotonic()
        rows.append(place.run_job())
        rows[-1].seconds = time.monotonic() - t0
        echo(format_row(rows[-1]))
    return rows

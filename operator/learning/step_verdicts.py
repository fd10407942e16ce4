"""What a job's step times say: its step-time speedup, and the changes not to learn (pure).

Users pay for step time (issue 31). From the step times a job's pods reported per
table version (operator/store/steps.py `JobSteps`) and the job's calls per table
version, cell and configuration (`VersionCell`):

- **Status.** `found` when a pod's sidecar found the training step, `none` when every
  pod's sidecar found no repeating pattern (then its changes were judged on kernel
  time alone), `learning` otherwise; None when no batch carried step times.
- **Speedup over NCCL's default.** A table version *ran NCCL's own choices* when every
  call that did not explore did: NCCL decided (origin `default`), or the table chose
  NCCL's own algorithm and protocol with NCCL's channels and chunk. The median step of
  the such version with the most steps is the NCCL-default step; the job's speedup is
  that step times the steps measured, over the steps' measured time (each version's
  median times its steps). Steps are taken per call of their period (a sidecar whose
  detector relearned a step k times as long measured k steps at once). A version's
  figure for the job is the median over its pods.
  None when no version that ran NCCL's own choices has steps.
- **Refusals.** A *change* is a table version whose choice (the configuration that ran
  most of a cell's calls that did not explore) differs in some cell from the
  reference: the latest earlier version with `STEP_MIN_STEPS` steps that was not found
  slower. A pod finds it slower by the sidecar's own rule (sidecar/step_judge.py): the
  medians differ by more than `STEP_MARGIN` of the reference and `STEP_Z` standard
  errors (the pod's robust spread over at most `STEP_WINDOW` steps). The *job* finds
  it slower only when more than half of its pods that measured the version do: one
  pod cannot speak for its job unless the job's other pods confirm it (the rule of
  findings across jobs, operator/learning/findings.py, one level down). Each changed
  cell whose collectives got faster (its new choice's mean call time below the
  reference's) is a `Refusal`: that job's measurements of that configuration in that
  cell are not learned from (retraining skips them; findings count them against it).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from dynamiccl import constants as c
from dynamiccl.api.learning import ConfigKey
from dynamiccl.api.rewards import Origin, StepStatus
from dynamiccl.operator.store.backend import Backend
from dynamiccl.operator.store.steps import (
    Cell,
    JobSteps,
    PodSteps,
    Refusal,
    VersionCell,
    job_steps,
    record_refusals,
    version_cells,
)

NO_STEP_REASON: Final = (
    "no step found: the sidecars found no repeating pattern of collective calls, "
    "so every change was judged on kernel time"
)
LEARNING_REASON: Final = "the sidecars are still looking for the training step"
NO_BASELINE_REASON: Final = (
    "no steps were measured under NCCL's own choices, so there is no step-time speedup to report"
)


@dataclass(frozen=True)
class StepReport:
    """A job's step-time figures for its TuningRun, and the changes not to learn."""

    status: StepStatus | None = None
    reason: str = ""
    steps: int = 0
    measured_us: float = 0.0  # the measured steps' time
    nccl_default_us: float | None = None  # the same steps at NCCL's default step
    baseline_version: int | None = None
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.nccl_default_us is None or self.measured_us <= 0:
            return None
        return self.nccl_default_us / self.measured_us


def job_status(status: Mapping[str, StepStatus]) -> tuple[StepStatus | None, str]:
    """The job's step status from its pods' latest ones, and why when it is not `found`."""
    got = set(status.values())
    if not got:
        return None, ""
    if StepStatus.FOUND in got:
        return StepStatus.FOUND, ""
    if got == {StepStatus.NONE}:
        return StepStatus.NONE, NO_STEP_REASON
    return StepStatus.LEARNING, LEARNING_REASON


@dataclass
class _Tally:
    calls: int = 0
    time_us: float = 0.0


Choices = dict[int, dict[Cell, tuple[ConfigKey, float]]]  # version -> cell -> (choice, mean us)


def choices(cells: Iterable[VersionCell]) -> tuple[Choices, set[int]]:
    """Per version and cell the choice (most non-exploratory calls) and its mean call time;
    and the versions that ran NCCL's own choices in every cell."""
    tally: dict[tuple[int, Cell], dict[tuple[ConfigKey, str], _Tally]] = defaultdict(dict)
    own_pair: dict[Cell, set[tuple[str, str]]] = defaultdict(set)
    for vc in cells:
        if vc.origin == Origin.EXPLORE.value or vc.calls <= 0:
            continue
        t = tally[(vc.table_version, vc.cell)].setdefault((vc.config, vc.origin), _Tally())
        t.calls += vc.calls
        t.time_us += vc.time_us
        if vc.origin == Origin.DEFAULT.value:
            own_pair[vc.cell].add(vc.config[:2])
    out: Choices = defaultdict(dict)
    not_own: set[int] = set()
    for (v, cell), arms in tally.items():
        (config, _), t = max(arms.items(), key=lambda kv: (kv[1].calls, kv[0]))
        out[v][cell] = (config, t.time_us / t.calls)
        for (cfg, org), _ in arms.items():
            nccl_like = cfg[2:] == (0, 0) and cfg[:2] in own_pair[cell]
            if org != Origin.DEFAULT.value and not nccl_like:
                not_own.add(v)
    return dict(out), set(out) - not_own


def _by_version(pods: Iterable[PodSteps]) -> dict[int, dict[str, PodSteps]]:
    out: dict[int, dict[str, PodSteps]] = defaultdict(dict)
    for p in pods:
        out[p.table_version][p.pod_uid] = p
    return dict(out)


def _slower(ref: PodSteps, new: PodSteps) -> bool:
    """The sidecar's rule: slower by more than the margin and Z standard errors."""

    def se(p: PodSteps) -> float:
        return p.spread_us / math.sqrt(min(p.steps, c.STEP_WINDOW))

    noise = c.STEP_Z * math.hypot(se(ref), se(new))
    return new.median_us - ref.median_us > max(c.STEP_MARGIN * ref.median_us, noise)


def refusals(steps: JobSteps, picks: Choices) -> list[Refusal]:
    """The changes the job's pods found slower while their collectives got faster."""
    by_v = {
        v: {u: p for u, p in pods.items() if p.steps >= c.STEP_MIN_STEPS}
        for v, pods in _by_version(steps.versions).items()
    }
    kept: list[int] = []  # judged versions, oldest first, not found slower
    out: list[Refusal] = []
    for v in sorted(x for x, pods in by_v.items() if pods):
        ref = kept[-1] if kept else None
        changed = _changed(picks.get(ref, {}), picks.get(v, {})) if ref is not None else {}
        if ref is None or not changed:
            kept.append(v)
            continue
        pods = by_v[v]
        # a pod's steps of another period are another step (its detector relearned): not
        # comparable (sidecar/step_judge.py compares versions only at the same period too)
        pairs = [
            (a, p)
            for u, p in pods.items()
            if (a := by_v[ref].get(u)) is not None and a.period == p.period
        ]
        slower = [(a, b) for a, b in pairs if _slower(a, b)]
        if 2 * len(slower) <= len(pods):
            kept.append(v)
            continue
        slowdown = statistics.median(b.median_us / a.median_us - 1.0 for a, b in slower)
        for cell, ((_, old_us), (new, new_us)) in sorted(changed.items()):
            seen = any((r.cell, r.config) == (cell, new) for r in out)  # one verdict each
            if new_us < old_us and not seen:  # collectives faster: kernel time would learn it
                out.append(
                    Refusal(cell, new, v, ref, slowdown, old_us / new_us, len(slower), len(pods))
                )
    return out


def _changed(
    old: Mapping[Cell, tuple[ConfigKey, float]], new: Mapping[Cell, tuple[ConfigKey, float]]
) -> dict[Cell, tuple[tuple[ConfigKey, float], tuple[ConfigKey, float]]]:
    return {k: (old[k], n) for k, n in new.items() if k in old and old[k][0] != n[0]}


def report(steps: JobSteps, cells: Iterable[VersionCell]) -> StepReport:
    """The job's `StepReport` (see the module docstring)."""
    status, reason = job_status(steps.status)
    picks, own = choices(cells)
    # per version: the median step per call and the steps' calls (a version whose detector
    # locked on k steps at once measures k times the step over k times the calls)
    per_version = {
        v: (statistics.median(p.median_us / (p.period or 1) for p in pods.values()),
            round(statistics.median(p.steps * (p.period or 1) for p in pods.values())),
            round(statistics.median(p.steps for p in pods.values())))
        for v, pods in _by_version(steps.versions).items()
    }  # fmt: skip
    calls = sum(k for _, k, _ in per_version.values())
    measured = sum(m * k for m, k, _ in per_version.values())
    base = max((v for v in per_version if v in own), key=lambda v: per_version[v][2], default=None)
    if status is StepStatus.FOUND and base is None:
        reason = NO_BASELINE_REASON
    return StepReport(
        status=status,
        reason=reason,
        steps=sum(n for _, _, n in per_version.values()),
        measured_us=measured,
        nccl_default_us=None if base is None else per_version[base][0] * calls,
        baseline_version=base,
        refusals=refusals(steps, picks),
    )


def judge_job(backend: Backend, job_uid: str, namespace: str, now: float) -> tuple[StepReport, int]:
    """Read the job's step times and calls, store its new refusals; (report, refusals new)."""
    rep = report(job_steps(backend, job_uid), version_cells(backend, job_uid))
    added = record_refusals(backend, job_uid, namespace, rep.refusals, now) if rep.refusals else 0
    return rep, added

"""Step time judges every table change the sidecar's tuner commits (issue 31.2; pure).

Per-call kernel time ranks a cell's candidates (precise, cheap); it cannot see
what a choice costs the rest of the step: each NCCL channel is a thread block on
its own SM for the kernel's run, so a collective overlapped with compute (DDP's
buckets during the backward pass) with more channels can run faster and make the
step slower (docs/simulator.md §8). So every change stays only if the training
step did not get slower.

`StepJudge` takes the steps the detector finds (sidecar/steps.py) with the
committed history (sidecar/attribution.py): a step belongs to the table in effect
at its first call on the clock communicator, and is dropped when the next step's
first call runs under another table (it crosses an epoch boundary). Per table
version it keeps the last `MAX_STEPS` step times of one period (the clock's calls
per step): a step of another period (the detector relearned: a lock on a part of
the step replaced by the whole step) starts the version's times again, and two
versions are compared only at the same period.

A change is a table version whose cells' committed choice (first choice; none:
NCCL decides) differs from the *reference*, the latest earlier version that was
measured for `min_steps` steps and not rejected (a version the tuner replaced
before it had that many steps is judged through the next one). Version 0 is the
steps before the first committed epoch: NCCL decides every cell. So the job's
initial table (a model's or a cluster finding's choices) is judged against NCCL's
own choices like any change, once NCCL's steps were measured (sidecar/step_watch.py
holds the first table back for them, within a budget). Once the new
version has `min_steps` steps (sequential test before/after): with medians
``m_ref``, ``m_new`` and robust standard errors (1.4826 MAD / sqrt(n)), the
change is *slower* when ``m_new - m_ref > max(margin * m_ref, z * sqrt(se_ref^2
+ se_new^2))``: it is rejected (`Vetoes`: each changed cell goes back to the
reference's choice in every later table, and the new choice is never committed
or explored again in that cell for this job). A difference above zero but within
the noise waits for more steps, up to `max_steps`, then the change is kept; so
does a change not slower. A change that only puts back choices a veto kept is
not judged (a revert is not reverted).

Exploration cost in step time (`summary`): per table version, what the steps with
an explored call (on the clock communicator; the sidecar knows each call's origin)
took beyond the median step of that version without one, summed, as a share of all
step time measured (a version whose every step explored is left out; None before
any step).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.table import Cell, Choice, DecisionTable
from dynamiccl.sidecar.attribution import Arm, History, TableView, arm_of, choice_of
from dynamiccl.sidecar.steps import Step

CellId = tuple[int, int, int]  # (scale, coll, bucket), as sidecar/tuning.py keys cells
MAX_STEPS: Final = c.STEP_WINDOW  # step times kept per table version
MAX_VERSIONS: Final = 64  # table versions kept (the oldest forgotten first)
MIN_STEPS: Final = c.STEP_MIN_STEPS
MAX_WAIT_STEPS: Final = 64  # steps of a change within the noise before it is kept
MARGIN: Final = c.STEP_MARGIN  # a change slower by less than this share of the step is kept
Z: Final = c.STEP_Z  # standard errors of the difference a slowdown must exceed
_MAD_SD: Final = 1.4826  # a normal sample's SD per MAD


@dataclass(slots=True)
class Steps:
    """The step times measured under one table version."""

    explores: bool  # the table lets some cell explore
    times: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_STEPS))
    period: int = 0  # the clock's calls per step of the steps in `times`
    count: int = 0  # all steps measured (the deque keeps the last MAX_STEPS)
    total_us: float = 0.0
    clean: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_STEPS))  # no explored call
    explored: int = 0  # steps with an explored call
    explored_us: float = 0.0

    def add(self, us: float, explored: bool, period: int = 0) -> None:
        if period != self.period:  # the detector's step changed: earlier times are not one
            self.times.clear()
            self.period = period
        self.times.append(us)
        self.count += 1
        self.total_us += us
        if explored:
            self.explored += 1
            self.explored_us += us
        else:
            self.clean.append(us)

    def exploration_us(self) -> float | None:
        """What the steps with an explored call took beyond the median step without one."""
        if not self.explored:
            return 0.0
        if not self.clean:
            return None
        return self.explored_us - self.explored * float(statistics.median(self.clean))

    def median(self) -> float:
        return float(statistics.median(self.times))

    def spread(self) -> float:
        """Robust SD of one step (1.4826 MAD)."""
        m = self.median()
        return _MAD_SD * float(statistics.median(abs(t - m) for t in self.times))

    def se(self) -> float:
        return self.spread() / math.sqrt(len(self.times))


@dataclass(frozen=True)
class Verdict:
    """A judged change: `version` against `reference`."""

    version: int
    reference: int
    kept: bool
    ref_us: float
    new_us: float
    cells: tuple[CellId, ...]

    @property
    def slowdown(self) -> float:
        return self.new_us / self.ref_us - 1.0


@dataclass
class Vetoes:
    """Per cell, the choices step time rejected for this job and the choice kept instead
    (None: NCCL's own)."""

    bad: dict[CellId, set[Arm]] = field(default_factory=dict)
    keep: dict[CellId, Arm | None] = field(default_factory=dict)

    def reject(self, cid: CellId, arm: Arm | None, keep: Arm | None) -> None:
        if arm is not None:
            self.bad.setdefault(cid, set()).add(arm)
        self.keep[cid] = keep

    def is_bad(self, cid: CellId, arm: Arm) -> bool:
        got = self.bad.get(cid)
        return got is not None and arm in got

    def indices(self, cid: CellId, index: dict[Arm, int]) -> list[int]:
        """The rejected choices of the cell, as indices of a tuner's arms (`index`)."""
        got = self.bad.get(cid, ())
        return [index[a] for a in got if a in index]

    def committed(self, cid: CellId, arm: Arm, nccl: Arm | None) -> Arm:
        """What a cell commits when its tuner commits `arm`: the kept choice if step time
        rejected `arm` (`nccl`, the cell's NCCL arm, stands for NCCL's own choice)."""
        if not self.is_bad(cid, arm):
            return arm
        kept = self.keep.get(cid)
        return kept if kept is not None else (nccl if nccl is not None else arm)

    def to_nccl(self, cid: CellId, arm: Arm) -> bool:
        """Step time rejected `arm` where NCCL's own choice ran before: NCCL decides again."""
        return self.is_bad(cid, arm) and cid in self.keep and self.keep[cid] is None

    def unvetoed(self, cid: CellId, choices: list[Choice]) -> list[Choice]:
        return [ch for ch in choices if not self.is_bad(cid, arm_of(ch))]

    def untuned(self, cell: Cell) -> Cell:
        """A table cell no tuner runs, its committed choice replaced if step time rejected
        it (by the choice kept; none: NCCL decides)."""
        cid = (cell.scale, cell.collective.nccl_id, cell.bucket)
        if not cell.choices or not self.is_bad(cid, arm_of(cell.choices[0])):
            return cell
        kept = self.keep.get(cid)
        if kept is None:
            return cell.model_copy(update={"choices": ()})
        rest = self.unvetoed(cid, [ch for ch in cell.choices if arm_of(ch) != kept])
        return cell.model_copy(update={"choices": (choice_of(kept), *rest)[:4]})

    def signature(self) -> tuple[object, ...]:
        return tuple(sorted((cid, tuple(sorted(arms))) for cid, arms in self.bad.items()))


def first_choices(table: DecisionTable) -> dict[CellId, Arm | None]:
    """Per cell, its committed choice (None: NCCL decides)."""
    return {
        (c.scale, c.collective.nccl_id, c.bucket): arm_of(c.choices[0]) if c.choices else None
        for c in table.cells
    }


def changed_cells(
    old: DecisionTable, new: DecisionTable
) -> dict[CellId, tuple[Arm | None, Arm | None]]:
    """Cells whose committed choice differs: cell -> (old choice, new choice)."""
    return _changed(first_choices(old), first_choices(new))


def _changed(
    a: dict[CellId, Arm | None], b: dict[CellId, Arm | None]
) -> dict[CellId, tuple[Arm | None, Arm | None]]:
    return {cid: (a.get(cid), arm) for cid, arm in b.items() if a.get(cid) != arm}


def explores(table: DecisionTable) -> bool:
    return any(c.candidates and c.explore > 0 for c in table.cells)


def _puts_back(vetoes: Vetoes, cid: CellId, arm: Arm | None) -> bool:
    return cid in vetoes.keep and vetoes.keep[cid] == arm


@dataclass
class StepJudge:
    """Steps per table version, and the verdicts on the tuner's changes."""

    vetoes: Vetoes
    min_steps: int = MIN_STEPS
    max_steps: int = MAX_WAIT_STEPS
    margin: float = MARGIN
    z: float = Z
    by_version: dict[int, Steps] = field(default_factory=dict)
    tables: dict[int, DecisionTable] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    dropped: int = 0  # steps across an epoch boundary
    _judged: set[int] = field(default_factory=set)
    _rejected: set[int] = field(default_factory=set)

    def add(self, step: Step, history: History, explored: bool = False) -> int | None:
        """Credit one step (`explored`: one of its calls explored) to the table it ran
        under; its version (None: dropped)."""
        view = history.at(step.coll_seq)
        end = history.at(step.coll_seq + step.calls)
        if view is not end:
            self.dropped += 1
            return None
        v = view.version if view is not None else 0
        got = self.by_version.get(v)
        if got is None:
            got = self._new_version(v, view)
        got.add(step.duration_ns / 1e3, explored, step.calls)
        return v

    def _new_version(self, v: int, view: TableView | None) -> Steps:
        if len(self.by_version) >= MAX_VERSIONS:
            oldest = min(self.by_version)
            del self.by_version[oldest]
            self.tables.pop(oldest, None)
        if view is not None:
            self.tables[v] = view.table
        got = self.by_version[v] = Steps(explores=view is not None and explores(view.table))
        return got

    def check(self) -> list[Verdict]:
        """Judge every change with enough steps; the new verdicts (rejections applied)."""
        out = []
        for v in sorted(self.by_version):
            if v in self._judged or v not in self.tables:
                continue
            got = self._judge(v)
            if got is not None:
                out.append(got)
        return out

    def _reference(self, v: int) -> int | None:
        period = self.by_version[v].period
        for u in sorted(self.by_version, reverse=True):
            ref = self.by_version[u]
            if (
                u < v
                and u not in self._rejected
                and len(ref.times) >= self.min_steps
                and ref.period == period
            ):
                return u
        return None

    def _choices(self, u: int) -> dict[CellId, Arm | None] | None:
        """The committed choices of version `u` (version 0: NCCL decides every cell;
        None: a version forgotten)."""
        table = self.tables.get(u)
        if table is not None:
            return first_choices(table)
        return {} if u == 0 else None

    def nccl_steps(self) -> Steps | None:
        """The steps measured before the first committed epoch (NCCL's own choices)."""
        return self.by_version.get(0)

    def _judge(self, v: int) -> Verdict | None:
        new = self.by_version[v]
        u = self._reference(v)
        if len(new.times) < self.min_steps or u is None:
            return None
        old = self._choices(u)
        changes = _changed(old, first_choices(self.tables[v])) if old is not None else {}
        if not changes or all(_puts_back(self.vetoes, c, n) for c, (_, n) in changes.items()):
            self._judged.add(v)  # no change of a committed choice, or a revert
            return None
        ref = self.by_version[u]
        m_ref, m_new = ref.median(), new.median()
        noise = self.z * math.hypot(ref.se(), new.se())
        slower = m_new - m_ref > max(self.margin * m_ref, noise)
        if not slower and m_new > m_ref + self.margin * m_ref and len(new.times) < self.max_steps:
            return None  # slower by more than the margin but within the noise: more steps
        self._judged.add(v)
        verdict = Verdict(v, u, not slower, m_ref, m_new, tuple(sorted(changes)))
        if slower:
            self._rejected.add(v)
            for cid, (before, after) in changes.items():
                self.vetoes.reject(cid, after, before)
        self.verdicts.append(verdict)
        return verdict

    def version_steps(self, v: int) -> Steps | None:
        return self.by_version.get(v)

    def exploration_cost(self) -> float | None:
        """Share of the step time measured that exploration added (see the docstring)."""
        total = sum(s.total_us for s in self.by_version.values())
        extra = [s.exploration_us() for s in self.by_version.values()]
        known = [x for x in extra if x is not None]
        if total <= 0 or not known:
            return None
        return sum(known) / total

    def summary(self) -> dict[str, Any]:
        """For the sidecar's --json report."""
        cost = self.exploration_cost()
        return {
            "step_versions": {
                str(v): {"steps": s.count, "median_us": round(s.median(), 3)}
                for v, s in sorted(self.by_version.items())
                if s.times
            },
            "step_rejected_changes": [
                {"version": x.version, "reference": x.reference, "slowdown": round(x.slowdown, 4)}
                for x in self.verdicts
                if not x.kept
            ],
            "step_kept_changes": sum(1 for x in self.verdicts if x.kept),
            "step_exploration_cost_percent": None if cost is None else round(100 * cost, 3),
            "steps_across_boundaries": self.dropped,
        }

"""The hard exploration budget of a job, measured and enforced by its sidecar (issue 21.3).

`BudgetGuard` watches every measured call of the pod: an exploratory call
(origin `explore`) costs its time minus what the cell's own choice takes (the
mean of the cell's non-exploratory calls so far; calls explored before the cell
has any are charged once it has). Once the cost passes `percent` % of the
pod's collective time (`HEADROOM` of it: calls go on exploring until the new
table's boundary; after `min_calls` calls, so one early call does not
decide; before `horizon_calls` calls the time so far is extrapolated to that
many calls, so a job of at least that many calls stays within its budget while
front-loaded exploration is not stopped by its first calls), exploration is
over for the job: `BudgetedTuning` then proposes a
table without exploration (every cell keeps its choices, `explore` 0), which
reaches the plugin through the epoch protocol like any table, at a boundary
every rank agrees on. The stop is one-way: a job never explores again after
its budget is spent. The guardrail (policy/online) is untouched.

Every sidecar of the job decides from its own pod's measurements; a proposal
comes only from the leader, so the job stops when the leader's pod has spent
the budget (the pods of a job see the same calls, so their shares agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from dynamiccl.agent.tuning import Tuning
from dynamiccl.api.rewards import Origin
from dynamiccl.api.table import DecisionTable

CellKey = tuple[int, int, int, int]  # (collective, bucket, nranks, nnodes)
MIN_CALLS: Final = 1000
# The budget is a share of the job's collective time, which is known only at its end; until
# the pod has run this many calls, its time so far is extrapolated to this many (exploration
# is front-loaded: judged on the first calls alone, any exploration would look too costly).
HORIZON_CALLS: Final = 10_000
# Calls keep exploring until the table without exploration takes effect (the next drain and
# epoch boundary): stop at this share of the budget so those calls stay within it.
HEADROOM: Final = 0.8


@dataclass
class _Cell:
    calls: int = 0  # non-exploratory calls
    time_us: float = 0.0
    pending_calls: int = 0  # explored before the cell had a reference
    pending_us: float = 0.0


@dataclass
class BudgetGuard:
    """What exploration cost the pod so far, against `percent` % of its collective time."""

    percent: float = 1.0
    min_calls: int = MIN_CALLS
    horizon_calls: int = HORIZON_CALLS
    calls: int = 0
    total_us: float = 0.0
    explore_calls: int = 0
    explore_us: float = 0.0
    cost_us: float = 0.0
    stopped_at_call: int | None = None
    cells: dict[CellKey, _Cell] = field(default_factory=dict)

    def observe(self, cell: CellKey, origin: str, time_us: float) -> None:
        """One measured call."""
        self.calls += 1
        self.total_us += time_us
        c = self.cells.get(cell)
        if c is None:
            c = self.cells[cell] = _Cell()
        if origin == Origin.EXPLORE.value:
            self.explore_calls += 1
            self.explore_us += time_us
            if c.calls:
                self.cost_us += max(time_us - c.time_us / c.calls, 0.0)
            else:
                c.pending_calls += 1
                c.pending_us += time_us
        else:
            c.calls += 1
            c.time_us += time_us
            if c.pending_calls:
                ref = c.time_us / c.calls
                self.cost_us += max(c.pending_us - ref * c.pending_calls, 0.0)
                c.pending_calls, c.pending_us = 0, 0.0
        if self.stopped_at_call is None and self._over():
            self.stopped_at_call = self.calls

    def _over(self) -> bool:
        if self.calls < self.min_calls:
            return False
        horizon = self.total_us * max(self.horizon_calls / self.calls, 1.0)
        return self.cost_us > HEADROOM * self.percent / 100 * horizon

    @property
    def exhausted(self) -> bool:
        """True once exploration cost passed the budget (one-way)."""
        return self.stopped_at_call is not None

    @property
    def cost_percent(self) -> float:
        return 100.0 * self.cost_us / self.total_us if self.total_us > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """For the sidecar's --json report and the tests."""
        return {
            "exploration_calls": self.explore_calls,
            "exploration_cost_us": round(self.cost_us, 3),
            "collective_us": round(self.total_us, 3),
            "exploration_cost_percent": round(self.cost_percent, 4),
            "exploration_budget_percent": self.percent,
            "exploration_stopped_at_call": self.stopped_at_call,
        }


def without_exploration(table: DecisionTable) -> DecisionTable:
    """`table` with every cell's candidates and explore probability removed."""
    cells = tuple(
        c.model_copy(update={"candidates": (), "explore": 0.0}) for c in table.cells if c.choices
    )
    return table.model_copy(update={"cells": cells})


@dataclass
class BudgetedTuning(Tuning):
    """The online tuner, proposing tables without exploration once the budget is spent."""

    guard: BudgetGuard = field(default_factory=BudgetGuard)

    def signature(self) -> tuple[object, ...]:
        sig = super().signature()
        return (*sig, "exploration budget spent") if self.guard.exhausted else sig

    def table(self, version: int) -> DecisionTable | None:
        t = super().table(version)
        if t is None or not self.guard.exhausted:
            return t
        return without_exploration(t)

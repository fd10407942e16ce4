"""The hard exploration budget of a job, measured and enforced by its sidecar (issue 21.3).

`BudgetGuard` watches every measured call of the pod. An exploratory call
(origin `explore`) costs its time minus what the cell's own choice takes (the
mean of the cell's non-exploratory calls so far; calls explored before the cell
has any are charged once it has).

The budget accrues with the collective time the pod has spent: `percent` % of
it (`HEADROOM` of that, kept back for estimation error) is the credit, less the
cost already charged. Exploration is *open* only while the credit covers what
exploration can still cost before a decision to stop takes effect: the
`window_calls` calls until the next table without exploration reaches every
rank, at the explored share of calls measured while open, each at the measured
cost of an exploratory call. Before measurements the prior stands in: the
table's largest explore probability (`rate_prior`), each exploratory call
taking `PRIOR_SLOWDOWN` times the slowest cell's call. So the cost never runs
ahead of the time spent, whatever the job's length: a job too short to earn
the cost of one window never explores, a long one explores as its credit
allows. The one assumption: until the first exploratory calls are measured,
none is more than `PRIOR_SLOWDOWN` times slower than the slowest cell's choice
(a window of costlier ones can overshoot by its own cost).

The gate is closed at the start (no credit yet). When it closes, exploration
reopens only once the credit covers twice as many windows as at the previous
opening (at most `MAX_OPENINGS` times a job): every flip is a new table and
epoch (a job has 63), so flips must be few. `BudgetedTuning` proposes the table
without exploration (every cell keeps its choices, `explore` 0) while the gate
is closed; it reaches the plugin through the epoch protocol like any table, at
a boundary every rank agrees on. The guardrail (policy/online) is untouched.

Every sidecar of the job decides from its own pod's measurements; a proposal
comes only from the leader, so the leader's pod decides (the pods of a job see
the same calls, so their shares agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from dynamiccl.api.rewards import Origin
from dynamiccl.api.table import DecisionTable
from dynamiccl.sidecar.tuning import Tuning

CellKey = tuple[int, int, int, int]  # (collective, bucket, nranks, nnodes)
# Calls that may still explore after the gate closes: until the sidecar's next look at the
# rings and the next epoch boundary after it (the harness: a drain every 256 calls, boundaries
# every 64). A sidecar whose pod runs more calls between two looks should pass its own.
WINDOW_CALLS: Final = 1024
# Before the pod has measured exploration: the share of calls a table lets explore (default:
# the compile's 1/128 for explored cells, doubled; `rate_prior` takes the table's) and the
# time of an exploratory call as a multiple of the slowest cell's own call.
PRIOR_RATE: Final = 1 / 64
PRIOR_SLOWDOWN: Final = 4.0
PRIOR_CALLS: Final = 256  # weight of the rate prior, in calls
PRIOR_EXPLORES: Final = 4  # weight of the cost prior, in exploratory calls
# Share of the budget the gate spends; the rest absorbs a window costlier than expected.
HEADROOM: Final = 0.8
MAX_OPENINGS: Final = 8


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
    window_calls: int = WINDOW_CALLS
    rate_prior: float = PRIOR_RATE
    calls: int = 0
    total_us: float = 0.0
    explore_calls: int = 0
    explore_us: float = 0.0
    cost_us: float = 0.0
    charged_calls: int = 0  # exploratory calls whose cost is in cost_us
    pending_calls: int = 0  # exploratory calls waiting for their cell's reference
    open_calls: int = 0  # calls measured while the gate was open
    open_explores: int = 0
    slowest_us: float = 0.0  # the slowest cell's mean non-exploratory time
    is_open: bool = False
    openings: int = 0
    stopped_at_call: int | None = None  # the first close after an opening
    cells: dict[CellKey, _Cell] = field(default_factory=dict)

    def observe(self, cell: CellKey, origin: str, time_us: float) -> None:
        """One measured call."""
        self.calls += 1
        self.total_us += time_us
        c = self.cells.get(cell)
        if c is None:
            c = self.cells[cell] = _Cell()
        if self.is_open:
            self.open_calls += 1
        if origin == Origin.EXPLORE.value:
            self._explored(c, time_us)
        else:
            c.calls += 1
            c.time_us += time_us
            ref = c.time_us / c.calls
            self.slowest_us = max(self.slowest_us, ref)
            if c.pending_calls:
                self.cost_us += max(c.pending_us - ref * c.pending_calls, 0.0)
                self.charged_calls += c.pending_calls
                self.pending_calls -= c.pending_calls
                c.pending_calls, c.pending_us = 0, 0.0
        self._gate()

    def _explored(self, c: _Cell, time_us: float) -> None:
        self.explore_calls += 1
        self.explore_us += time_us
        if self.is_open:
            self.open_explores += 1
        if c.calls:
            self.cost_us += max(time_us - c.time_us / c.calls, 0.0)
            self.charged_calls += 1
        else:
            c.pending_calls += 1
            c.pending_us += time_us
            self.pending_calls += 1

    def note_drain(self, records: int, boundary_calls: int) -> None:
        """A look at the rings read `records` calls: a stop decided now reaches the plugin only
        after the next look (as many again) and the epoch boundary after it (`boundary_calls`),
        so the window grows to cover that; it never shrinks."""
        self.window_calls = max(self.window_calls, 2 * records + boundary_calls)

    def expected_cost_us(self) -> float:
        """The expected cost of one exploratory call (measured, with the prior's weight)."""
        ref = self.slowest_us if self.slowest_us > 0 else self.total_us / max(self.calls, 1)
        prior = (PRIOR_SLOWDOWN - 1.0) * ref
        return (self.cost_us + PRIOR_EXPLORES * prior) / (self.charged_calls + PRIOR_EXPLORES)

    def credit_us(self) -> float:
        """The budget earned so far less the cost spent (charged and expected for pending)."""
        earned = HEADROOM * self.percent / 100.0 * self.total_us
        return earned - self.cost_us - self.pending_calls * self.expected_cost_us()

    def reserve_us(self) -> float:
        """What exploration may cost in the window before a stop takes effect."""
        rate = (self.open_explores + self.rate_prior * PRIOR_CALLS) / (
            self.open_calls + PRIOR_CALLS
        )
        return self.window_calls * rate * self.expected_cost_us()

    def _gate(self) -> None:
        if self.calls % 16 and not self.is_open:  # closed: a look every 16 calls is enough
            return
        credit, reserve = self.credit_us(), self.reserve_us()
        if self.is_open:
            if credit < reserve:
                self.is_open = False
                if self.stopped_at_call is None:
                    self.stopped_at_call = self.calls
        elif self.openings < MAX_OPENINGS and credit >= reserve * 2**self.openings:
            self.is_open = True
            self.openings += 1

    @property
    def exhausted(self) -> bool:
        """True while exploration is closed (no credit for another window of it)."""
        return not self.is_open

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
            "exploration_openings": self.openings,
            "exploration_open": self.is_open,
        }


def max_explore(table: DecisionTable) -> float:
    """The largest share of a cell's calls the table lets explore (the guard's rate prior)."""
    return max((c.explore for c in table.cells if c.candidates), default=0.0)


def without_exploration(table: DecisionTable) -> DecisionTable:
    """`table` with every cell's candidates and explore probability removed."""
    cells = tuple(
        c.model_copy(update={"candidates": (), "explore": 0.0}) for c in table.cells if c.choices
    )
    return table.model_copy(update={"cells": cells})


@dataclass
class BudgetedTuning(Tuning):
    """The online tuner, proposing tables without exploration while the gate is closed."""

    guard: BudgetGuard = field(default_factory=BudgetGuard)

    def signature(self) -> tuple[object, ...]:
        sig = super().signature()
        return (*sig, "exploration closed") if self.guard.exhausted else sig

    def summary(self) -> dict[str, Any]:
        """The budget's report."""
        return self.guard.summary()

    def table(self, version: int) -> DecisionTable | None:
        t = super().table(version)
        if t is None or not self.guard.exhausted:
            return t
        return without_exploration(t)

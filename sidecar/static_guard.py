"""The guardrail in mode `static`: the table's choice against NCCL's own, per cell.

A static table is compiled with NCCL's own pick as each cell's one candidate
(policy/runtime/comparison.py), explored on a decaying share of the cell's calls. The
sidecar credits every measured call of such a cell to the table's first choice or to
NCCL's pick (attribution: the candidate while the cell compares, NCCL's default once it
is reverted) and, once per table round (`end_round`), judges each cell with the
guardrail's own test (`policy/online/guardrail.trips`: slower than NCCL's by more than
`regressionThreshold`, `z` standard errors of evidence, `minSamples` samples on each
side). A tripped cell is reverted: the next table lets NCCL decide there (no choice, no
candidate), and it is reported as a guardrail event. Nothing else is tuned: the table
keeps its choices wherever they hold, and `signature()` changes only on a revert, so a
static job proposes a new table only to take a bad cell back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dynamiccl.api.rewards import EventKind
from dynamiccl.api.table import Cell, DecisionTable
from dynamiccl.policy.online.bandit import ArmStats, pooled_noise_sd
from dynamiccl.policy.online.guardrail import regression, trips
from dynamiccl.sidecar.attribution import Arm, arm_of, choice_of
from dynamiccl.sidecar.cell_arms import CellId, cell_event
from dynamiccl.sidecar.explore_budget import BudgetedTuning


@dataclass
class GuardedCell:
    """One compared cell: the table's first choice (arm 0) against NCCL's pick (arm 1)."""

    cell: Cell
    arms: tuple[Arm, Arm]
    stats: tuple[ArmStats, ArmStats] = field(default_factory=lambda: (ArmStats(), ArmStats()))
    calls: int = 0
    reverted: bool = False


def guarded_cells(table: DecisionTable | None) -> dict[CellId, GuardedCell]:
    """The cells of a static table that carry a comparison arm."""
    out: dict[CellId, GuardedCell] = {}
    for c in table.cells if table is not None else ():
        if c.choices and len(c.candidates) == 1:
            arms = (arm_of(c.choices[0]), arm_of(c.candidates[0]))
            out[(c.scale, c.collective.nccl_id, c.bucket)] = GuardedCell(c, arms)
    return out


@dataclass
class StaticTuning(BudgetedTuning):
    """The sidecar's tuner in mode `static`: only the guardrail acts (module docstring)."""

    guarded: dict[CellId, GuardedCell] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.enabled = False  # no cell is tuned
        self.guarded = guarded_cells(self.base)

    def observe(  # noqa: PLR0917 -- one attributed call
        self, scale: int, coll: int, bucket: int, nranks: int, nnodes: int, arm: Arm, time_us: float
    ) -> None:
        g = self.guarded.get((scale, coll, bucket))
        if g is None or g.reverted or not (time_us > 0 and math.isfinite(time_us)):
            return
        if arm in g.arms:
            g.stats[g.arms.index(arm)].add(math.log(time_us))
            g.calls += 1

    def end_round(self, stretch: float | None = None) -> None:
        """Judge every compared cell with the guardrail's test; revert those that trip.
        (No cell is tuned, so no escape is ever due and no round is early: `stretch` is
        None, the signature `Tuning.end_round`'s.)"""
        cfg = self.cfg
        for g in self.guarded.values():
            if g.reverted:
                continue
            noise = pooled_noise_sd(g.stats, cfg.bandit)
            if trips(g.stats[0], g.stats[1], noise, cfg.guardrail):
                g.reverted = True
                self._report(g)

    def _report(self, g: GuardedCell) -> None:
        slower = regression(g.stats[0], g.stats[1]) or 0.0
        msg = (
            f"worse than NCCL default ({slower:+.1%} over {g.stats[1].n} calls of NCCL's"
            f" choice): arm {choice_of(g.arms[0]).model_dump(mode='json')}"
        )
        self.add_events([cell_event(g.cell, EventKind.GUARDRAIL_REVERT, g.calls, msg)])

    def reverted(self) -> list[CellId]:
        """The cells taken back to NCCL's own choice."""
        return sorted(cid for cid, g in self.guarded.items() if g.reverted)

    def summary(self) -> dict[str, Any]:
        """The budget's report (the comparison is not charged to it) and the reverts."""
        return {**super().summary(), "guardrail_reverted_cells": len(self.reverted())}

    def signature(self) -> tuple[object, ...]:
        return tuple(self.reverted())

    def table(self, version: int) -> DecisionTable | None:
        """The static table without its reverted cells: NCCL decides there."""
        if self.base is None:
            return None
        back = set(self.reverted())
        cells = tuple(
            c for c in self.base.cells if (c.scale, c.collective.nccl_id, c.bucket) not in back
        )
        return self.base.model_copy(update={"version": version, "cells": cells})

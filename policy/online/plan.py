"""One epoch's plan of a cell and how the plugin reads it (the rule every rank evaluates).

Within an epoch the plan (committed configuration, up to `MAX_CANDIDATES` weighted
exploration candidates, explore probability) is part of the agreed decision table;
call j of a cell tries what `dynamiccl.api.table.decide` selects from
`explore_hash(seed, comm id, nRanks, nNodes, collective, bucket, j)` (docs/plugin.md,
'Decisions').
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dynamiccl.api.nccl import Collective
from dynamiccl.api.table import Candidate, Cell, Choice, explore_hash


@dataclass(frozen=True)
class CellKey:
    """The rank-identical inputs of the plugin's exploration draw for one cell."""

    seed: int
    comm_id: int
    nranks: int
    nnodes: int
    collective: Collective
    bucket: int


@dataclass(frozen=True)
class Plan:
    """One epoch's table cell, in arm indices."""

    committed: int
    candidates: tuple[tuple[int, int], ...]  # (arm, integer weight 1..65535)
    explore: float  # probability a call explores a candidate

    @property
    def eps_q16(self) -> int:
        """The explore probability as the plugin stores it (same rounding as `Cell`)."""
        return min(round(self.explore * 65536), 65535)


@dataclass(frozen=True)
class Event:
    """Something an operator may want to see in the TuningRun status."""

    kind: str  # "guardrail" | "change" | "commit"
    epoch: int
    arm: int
    detail: str


def plan_choice(plan: Plan, key: CellKey, j: int) -> int:
    """The arm call j tries under `plan`: `table.decide` with every arm available."""
    eps = plan.eps_q16
    if plan.candidates and eps:
        h = explore_hash(
            key.seed, key.comm_id, key.nranks, key.nnodes, key.collective.nccl_id, key.bucket, j
        )
        if (h & 0xFFFF) < eps:
            total = sum(w for _, w in plan.candidates)
            r = ((h >> 32) * total) >> 32
            for arm, w in plan.candidates:
                if r < w:
                    return arm
                r -= w
    return plan.committed


def round_plan(plan: Plan, epoch_calls: int, round_calls: int) -> Plan:
    """`plan` as a table round of `round_calls` calls of the cell runs it.

    The tuner plans an epoch of `epoch_calls` calls; the sidecar's plans reach the plugin
    once per table round (tens of seconds, sidecar/table_changes.py), in which a busy cell
    makes hundreds or thousands of calls. Run as planned, such a round would explore at
    the epoch's probability for all of them: many times the looks the tuner planned, most
    of them on candidates it would have ruled out after a few. Scaled, the round explores
    the epoch's expected calls and the rest of it runs the committed configuration; the
    tuner counts one epoch of its budget for it (`BucketTuner.budget_spent`), so a busy
    cell gets the same number of decisions as a quiet one, one per round."""
    if round_calls <= epoch_calls or not plan.explore:
        return plan
    # at least the plugin's smallest non-zero probability: a round still explores
    return replace(plan, explore=max(plan.explore * epoch_calls / round_calls, 1 / 65536))


def plan_cell(plan: Plan, choices: Sequence[Choice], key: CellKey, scale: int) -> Cell:
    """The decision-table cell of a plan (`choices[i]` is arm i's configuration)."""
    return Cell(
        collective=key.collective,
        bucket=key.bucket,
        scale=scale,
        choices=(choices[plan.committed],),
        candidates=tuple(
            Candidate(**choices[a].model_dump(), weight=w) for a, w in plan.candidates
        ),
        explore=plan.explore,
    )

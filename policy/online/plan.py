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
from dynamiccl.api.table import MAX_CANDIDATES, WEIGHT_MAX, Candidate, Cell, Choice, explore_hash
from dynamiccl.policy.online.race import LOOK_CALLS, Race


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


def race_candidates(
    r: Race, committed: int, epoch_calls: int, explore_budget: float
) -> tuple[tuple[tuple[int, int], ...], float]:
    """The plan's weighted candidates and explore probability for the race's wants."""
    wants = [(i, w) for i, w in r.wants if i != committed]
    if r.leader is not None and r.leader != committed:
        # a leader the tuner has not committed to yet needs calls to get there
        wants.insert(0, (r.leader, max((w for _, w in r.wants), default=1.0)))
    wants = wants[:MAX_CANDIDATES]
    if not wants:
        return (), 0.0
    # an open arm (or a leader not committed yet) shares the epoch equally with the
    # committed arm: arms still in the race are near it, their calls cost little;
    # a first look takes its planned calls (`new_calls`; at most 2x that in a longer epoch)
    scale = max(1.0, epoch_calls / LOOK_CALLS)
    full = r.opened | r.steps | {r.leader}
    share = max(epoch_calls / (1 + len(wants)), *(w for _, w in wants))
    wants = [(i, share if i in full else w * min(scale, 2.0)) for i, w in wants]
    total = sum(w for _, w in wants)
    explore = min(total / epoch_calls, explore_budget, 1.0)
    top = max(w for _, w in wants)
    return tuple((i, max(1, round(w / top * WEIGHT_MAX))) for i, w in wants), explore

"""Both arms inside a canary job (issue 29): the promoted version's choices explored too.

A canary job runs the canary version's table. Compared only with other jobs (which
ran the promoted version), its speedup carries the jobs' differences too (their
mix of sizes, their nodes, their noise), and the judge needs several jobs on each
side. Where the two versions' tables choose otherwise, the job can measure both
itself: `add_arms` puts the promoted version's first choice of each such cell
first among the cell's exploration candidates (half of the cell's candidate
weight) and explores the cell at least at `ARM_RATE`. The job's rewards then hold
both versions' choices in the same job, cell by cell, and the canary judge
compares them there (operator/learning/within_job.py). The sidecar's guardrail and
online tuner act on the arm as on any candidate: a job whose promoted-version
choice is faster runs it.

Where the promoted version leaves a cell to NCCL (no choices: NCCL decides) and
the canary chooses there, the promoted version's choice is NCCL's own pick, with
NCCL's channels and chunk (`nccl_picker`): the (algorithm, protocol) the hardware
class's jobs measured NCCL run as its own decision there (`status.learning`), else
NCCL's cost model of the cell's communicator shape at the bucket's geometric
middle, as the compile asks it. The measured one comes first because the model's
pick at the middle of a bucket need not be NCCL's at the sizes the jobs call (one
measured run: 128 MiB all-reduce calls, NCCL's Ring/LL128; the model at 181 MiB,
Ring/Simple). The same the other way round: where the canary leaves a cell to NCCL and
the promoted version chooses there, the canary's side is NCCL's own pick and the job
explores the promoted choice. A retrained version can drop a choice in a cell it had
no rows of (its fine-tune moves the shared network: docs/security.md), and that
loss is what its jobs then measure. At most `MAX_ARMS` cells, in table order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.learning import ClassCoverage, Config
from dynamiccl.api.table import (
    MAX_CANDIDATES,
    WEIGHT_MAX,
    Candidate,
    Cell,
    Choice,
    DecisionTable,
)
from dynamiccl.api.tuning_run import MAX_ARMS, Arm
from dynamiccl.policy.runtime.cells import ALGOS, COLLS, PROTOS
from dynamiccl.policy.runtime.compile import communicators
from dynamiccl.policy.runtime.exploration import choice_key, nccl_own_pairs
from dynamiccl.policy.sim.nccl_model import NcclModel

ARM_RATE: Final = 4.0 / 128  # the cell's explore probability at least (as a confirmation's)


def _config(c: Choice) -> Config:
    algo, proto, nchannels, chunk_bytes = choice_key(c)
    return Config(algo=algo, proto=proto, nchannels=nchannels, chunk_bytes=chunk_bytes)


def _same(a: Choice, b: Choice) -> bool:
    return choice_key(a) == choice_key(b)


def _with_arm(cell: Cell, arm: Choice) -> Cell:
    """The cell with `arm` its first candidate, weighing as much as the others together."""
    others = tuple(c for c in cell.candidates if not _same(c, arm))[: MAX_CANDIDATES - 1]
    weight = min(max(1, sum(c.weight for c in others)), WEIGHT_MAX)
    first = Candidate(
        algo=arm.algo,
        proto=arm.proto,
        nchannels=arm.nchannels,
        chunk_bytes=arm.chunk_bytes,
        weight=weight,
    )
    return cell.model_copy(
        update={"candidates": (first, *others), "explore": max(cell.explore, ARM_RATE)}
    )


Picker = Callable[[Cell], Choice | None]


def nccl_picker(features: StateFeatures, coverage: ClassCoverage | None = None) -> Picker:
    """NCCL's own pick of a cell of the job's table (None: a scale class the job's
    communicators do not have): measured by the class's jobs, else NCCL's cost model."""
    systems = {c.scale: c.context.system for c in communicators(features)}
    models: dict[int, NcclModel] = {}  # built at the first cell that needs one
    measured = nccl_own_pairs(coverage)

    def pick(cell: Cell) -> Choice | None:
        if cell.scale not in systems:
            return None
        seen = measured.get((cell.collective.value, cell.bucket, cell.scale))
        if seen is not None:
            return seen
        if cell.scale not in models:
            models[cell.scale] = NcclModel(systems[cell.scale])
        model = models[cell.scale]
        a, p, _ = model.pick([COLLS.index(cell.collective)], [2.0 ** (cell.bucket + 0.5)])
        return Choice(algo=ALGOS[int(a[0])], proto=PROTOS[int(p[0])])

    return pick


def _runs(cell: Cell, mine: Cell | None, nccl: Picker | None) -> Choice | None:
    """What a version whose table has `mine` there runs in `cell`: its first choice, else
    NCCL's own pick (None: unknown)."""
    if mine is not None and mine.choices:
        return mine.choices[0]
    return nccl(cell) if nccl is not None else None


def add_arms(
    table: DecisionTable, baseline: DecisionTable, nccl: Picker | None = None
) -> tuple[DecisionTable, list[Arm]]:
    """`table` (the canary version's) with the baseline's choice explored in each cell whose
    first choice differs, and those cells (module docstring; `nccl`: NCCL's own pick where
    either version leaves the cell to NCCL, None: no arm there)."""
    base = {(c.collective, c.bucket, c.scale): c for c in baseline.cells}
    cells: list[Cell] = []
    arms: list[Arm] = []
    for cell in table.cells:
        other = base.get((cell.collective, cell.bucket, cell.scale))
        decides = bool(cell.choices) or (other is not None and bool(other.choices))
        mine = _runs(cell, cell, nccl) if decides else None
        theirs = _runs(cell, other, nccl) if mine is not None else None
        if mine is None or theirs is None or _same(mine, theirs) or len(arms) >= MAX_ARMS:
            cells.append(cell)
            continue
        arms.append(
            Arm(
                collective=cell.collective.value,
                size_bucket=cell.bucket,
                scale=cell.scale,
                choice=_config(mine),
                baseline=_config(theirs),
            )
        )
        cells.append(_with_arm(cell, theirs))
    return table.model_copy(update={"cells": tuple(cells)}), arms

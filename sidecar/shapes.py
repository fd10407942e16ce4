"""Online tuning of communicator shapes that no compiled table covers (issue 17.2).

The operator compiles a job's table for the communicator shapes its parallelism
annotation implies (policy/runtime/compile.py). A communicator of any other
shape (a group the annotation does not name, a sub-communicator a framework
splits off, degrees the annotation got wrong, or one past the table's
`MAX_SCALES`) finds no cell in the plugin and runs NCCL's own choice. Its
profiler records still reach the sidecar: the plugin registers every
communicator's (nranks, nnodes) in the shared memory, so each record is
attributed to its shape and scale class.

`ShapeTuning` is the sidecar's tuner (`BudgetedTuning`, sidecar/tuning.py) that
also tunes those: at the first measured call of a (collective, size bucket) of a
scale class the job's table does not carry, it seeds a cell there (`seed_cell`):
no choices (NCCL decides, as it did), and as candidates the fastest
alternatives to NCCL's pick by NCCL's own cost model of that shape (a generic
list where there is no model). The scale class joins the base table (while it
has fewer than `MAX_SCALES`) and from then on the cell is tuned like any
compiled one: the tuner's plan explores the candidates, the leader proposes the
table carrying the new scale, the epoch protocol commits it, and once a
candidate is measured better than NCCL's pick it becomes the cell's choice.

Every rank of such a communicator takes the same decision: what the plugin does
at a call depends only on the committed table (the same on every rank: all read
the table of the same committed epoch, in effect from the same call index), the
scale class of (nranks, nnodes), the collective, the size bucket, and the
exploration draw hashed from (seed, commId, nranks, nnodes, collective, bucket,
the call's index in its cell) — all identical on every rank of one communicator.
Communicators of different shapes but the same scale class share the cell (one
key; the plugin has no finer one), each drawing its exploration from its own
commId; the tuner learns from all of them.

NCCL's pick for such a shape is NCCL's cost model of it (`NcclDefaults` models
any group across the job's nodes) or, for a shape the model cannot resolve,
what NCCL was seen to run at the cell's first call (`ShapeDefaults`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Final

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto, collective_from_id
from dynamiccl.api.table import MAX_CANDIDATES, MAX_SCALES, WEIGHT_MAX, Candidate, Cell
from dynamiccl.api.tuning_policy import Mode
from dynamiccl.policy.runtime.compile import BUCKETS, INITIAL_EXPLORE
from dynamiccl.sidecar.attribution import Arm, arm_of
from dynamiccl.sidecar.baseline import Baseline, CellShape, NcclDefaults
from dynamiccl.sidecar.cell_arms import CellId
from dynamiccl.sidecar.config import AgentConfig
from dynamiccl.sidecar.explore_budget import BudgetedTuning, BudgetGuard
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.static_guard import StaticTuning

log = logging.getLogger("dynamiccl.sidecar.shapes")
ShapesByScale = dict[int, set[tuple[int, int]]]  # scale class -> (nranks, nnodes) seen

_ALGOS: Final = tuple(Algo)
_PROTOS: Final = tuple(Proto)
_ALL_REDUCE: Final = Collective.ALLREDUCE.nccl_id
_GATHER_SCATTER: Final = (Collective.ALLGATHER.nccl_id, Collective.REDUCESCATTER.nccl_id)
# Without a cost model of the shape: what every NCCL since 2.21 offers, most often best first
_RING, _TREE, _PAT = Algo.RING.nccl_id, Algo.TREE.nccl_id, Algo.PAT.nccl_id
_LL, _LL128, _SIMPLE = Proto.LL.nccl_id, Proto.LL128.nccl_id, Proto.SIMPLE.nccl_id
_GENERIC_ALL_REDUCE: Final = tuple((a, p) for p in (_SIMPLE, _LL128, _LL) for a in (_RING, _TREE))
_GENERIC_OTHER: Final = ((_RING, _SIMPLE), (_RING, _LL128), (_RING, _LL), (_PAT, _SIMPLE))


class ShapeDefaults(NcclDefaults):
    """NCCL's pick from its cost model of the shape, else what NCCL was seen to run."""

    def __init__(self, features: StateFeatures | None) -> None:
        super().__init__(features)
        self.observed: dict[CellShape, tuple[int, int, float]] = {}

    def note(self, shape: CellShape, arm: Arm, time_us: float) -> None:
        """NCCL ran `arm` for a call of `shape` on its own (kept for shapes without a model)."""
        if shape in self.observed or self.model(shape[2], shape[3]) is not None:
            return
        self.observed[shape] = (arm[0], arm[1], time_us)
        self.pick.cache_clear()

    def _pick(
        self, coll: int, bucket: int, nranks: int, nnodes: int
    ) -> tuple[int, int, float] | None:
        got = super()._pick(coll, bucket, nranks, nnodes)
        return got if got is not None else self.observed.get((coll, bucket, nranks, nnodes))


def _ranked_alternatives(
    defaults: NcclDefaults, shape: CellShape, default: tuple[int, int]
) -> list[tuple[int, int, float]]:
    """(algo, proto, relative weight) of the alternatives to NCCL's pick, best first."""
    coll, bucket, nranks, nnodes = shape
    model = defaults.model(nranks, nnodes)
    if model is not None:
        t = model.times([coll], [2.0 ** (bucket + 0.5)])[0]
        est = sorted(
            (float(t[a, p]), a, p)
            for a in range(len(_ALGOS))
            for p in range(len(_PROTOS))
            if math.isfinite(float(t[a, p])) and (a, p) != default
        )
        if est:
            best = max(est[0][0], 1e-9)
            return [(a, p, best / max(v, 1e-9)) for v, a, p in est]
    generic = _GENERIC_ALL_REDUCE if coll == _ALL_REDUCE else _GENERIC_OTHER
    pairs = [
        ap
        for ap in generic
        if ap != default and (ap[0] != _PAT or (coll in _GATHER_SCATTER and nnodes > 1))
    ]
    return [(a, p, 0.5**i) for i, (a, p) in enumerate(pairs)]


def seed_cell(defaults: NcclDefaults, scale: int, shape: CellShape, nccl_arm: Arm) -> Cell | None:
    """The cell a shape no table covers starts from (None: nothing to explore).

    No choices: NCCL keeps deciding. Candidates: up to `MAX_CANDIDATES` alternatives to
    NCCL's pick (its cost model's, else `nccl_arm`, what NCCL ran), the ones NCCL's own
    model estimates fastest first, weighted by its estimate relative to the best of them.
    """
    pick = defaults.pick(*shape)
    default = (pick[0], pick[1]) if pick is not None else (nccl_arm[0], nccl_arm[1])
    alts = _ranked_alternatives(defaults, shape, default)[:MAX_CANDIDATES]
    if not alts:
        return None
    cands = tuple(
        Candidate(
            algo=_ALGOS[a], proto=_PROTOS[p], weight=max(1, min(WEIGHT_MAX, round(w * WEIGHT_MAX)))
        )
        for a, p, w in alts
    )
    return Cell(
        collective=collective_from_id(shape[0]),
        bucket=shape[1],
        scale=scale,
        candidates=cands,
        explore=INITIAL_EXPLORE,
    )


@dataclass
class ShapeTuning(BudgetedTuning):
    """The sidecar's tuner, also learning cells for communicator shapes no table covers."""

    seeded: ShapesByScale = field(default_factory=dict)  # tuned online
    no_room: ShapesByScale = field(default_factory=dict)  # left to NCCL: the table is full
    metrics: AgentMetrics | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._compiled = frozenset(self.base.scales if self.base is not None else ())
        # seeded cells whose candidates never ran yet: the table carrying them is not in
        # effect, so their calls (NCCL's pick) do not open the tuner's budget
        self._pending: dict[CellId, frozenset[Arm]] = {}

    def observe(  # noqa: PLR0917 -- one attributed call
        self, scale: int, coll: int, bucket: int, nranks: int, nnodes: int, arm: Arm, time_us: float
    ) -> None:
        if scale not in self._compiled and self.enabled and self.base is not None:
            cid = (scale, coll, bucket)
            if cid not in self._base_cells:
                self._seed(scale, (coll, bucket, nranks, nnodes), arm, time_us)
            live = self._pending.get(cid)
            if live is not None:
                if arm not in live:
                    return  # NCCL's own pick, the cell not in effect yet: no budget spent
                del self._pending[cid]  # a candidate ran: a table carrying the cell is in effect
        super().observe(scale, coll, bucket, nranks, nnodes, arm, time_us)

    def signature(self) -> tuple[object, ...]:
        """The tuned cells', and the cells seeded but not in effect yet (to be proposed)."""
        return (*super().signature(), *sorted(self._pending))

    def _seed(self, scale: int, shape: CellShape, arm: Arm, time_us: float) -> None:
        coll, bucket, nranks, nnodes = shape
        if (scale, coll, bucket) in self._base_cells or bucket not in BUCKETS:
            return
        base = self.base
        assert base is not None
        if scale not in base.scales and len(base.scales) >= MAX_SCALES:
            if scale not in self.no_room:
                log.warning(
                    "communicator shape %d ranks / %d nodes (scale class %d): the table already "
                    "carries %d scale classes; NCCL's own choice stays in effect for it",
                    nranks, nnodes, scale, MAX_SCALES,
                )  # fmt: skip
            self._count(self.no_room, scale, (nranks, nnodes), "untuned")
            return
        if isinstance(self.defaults, ShapeDefaults) and time_us > 0:
            self.defaults.note(shape, arm, time_us)
        cell = seed_cell(self.defaults, scale, shape, arm)
        if cell is None:
            return
        if scale not in self.seeded:
            log.info(
                "communicator shape %d ranks / %d nodes (scale class %d) has no table: tuning it "
                "online", nranks, nnodes, scale,
            )  # fmt: skip
        self._count(self.seeded, scale, (nranks, nnodes), "online")
        scales = base.scales if scale in base.scales else (*base.scales, scale)
        self.base = base.model_copy(update={"scales": scales, "cells": (*base.cells, cell)})
        self._base_cells[(scale, coll, bucket)] = cell
        self._pending[(scale, coll, bucket)] = frozenset(arm_of(c) for c in cell.candidates)

    def _count(
        self,
        by_scale: dict[int, set[tuple[int, int]]],
        scale: int,
        shape: tuple[int, int],
        state: str,
    ) -> None:
        got = by_scale.setdefault(scale, set())
        if shape not in got:
            got.add(shape)
            if self.metrics is not None:
                self.metrics.online_shapes.labels(state=state).inc()

    def summary(self) -> dict[str, Any]:
        """The budget's report and the shapes tuned online or left to NCCL (no room)."""

        def shapes(by_scale: ShapesByScale) -> list[list[int]]:
            return sorted([n, k, s] for s, got in by_scale.items() for n, k in got)

        return {
            **super().summary(),
            "online_shapes": shapes(self.seeded),  # [nranks, nnodes, scale class]
            "untuned_shapes": shapes(self.no_room),
        }


def sidecar_tuning(
    cfg: AgentConfig, guard: BudgetGuard, metrics: AgentMetrics | None = None
) -> tuple[Baseline, BudgetedTuning]:
    """The sidecar's NCCL baseline and online tuner for `cfg` (mode `static`: only the
    guardrail, sidecar/static_guard.py)."""
    baseline = Baseline(ShapeDefaults(cfg.features))
    if cfg.exploration.mode is Mode.STATIC and cfg.table is not None:
        return baseline, StaticTuning(cfg.table, cfg.tuner(), baseline.defaults, guard=guard)
    tuning = ShapeTuning(
        cfg.table,
        cfg.tuner(),
        baseline.defaults,
        cfg.learned,
        cfg.channel_range,
        allowed_pairs=cfg.allowed_pairs,
        rounds=True,
        guard=guard,
        metrics=metrics,
    )
    return baseline, tuning

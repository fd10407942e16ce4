"""Folding one ring block: attribute each record, then count it everywhere it counts.

Each record of a block read from a ring (sidecar/ring.py) is attributed
(sidecar/attribution.py: the table version, size bucket, choice and origin of the
call, from the committed history) and, in ring order, folded into:

- the aggregates (sidecar/aggregate.py), which the cut turns into reward records;
- the NCCL baseline (sidecar/baseline.py), when NCCL itself chose the call;
- the online tuner (sidecar/shapes.py);
- the exploration budget (sidecar/explore_budget.py);
- the step watch (sidecar/step_watch.py), for calls the tuner explored.

A record the sidecar cannot use is counted in `skipped` by reason, never folded:
its communicator is not registered in the shared memory file
(`unregistered_communicator`), its fields are out of NCCL's ranges or it took no
time (`unusable`), or the aggregates refused it (`refused`).
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Protocol

from dynamiccl.api.table import scale_class
from dynamiccl.sidecar.aggregate import Aggregator, Key
from dynamiccl.sidecar.attribution import DEFAULT, EXPLORE, History, attribute
from dynamiccl.sidecar.baseline import Baseline
from dynamiccl.sidecar.explore_budget import BudgetedTuning, BudgetGuard
from dynamiccl.sidecar.ring import Columns
from dynamiccl.sidecar.step_watch import StepWatch


class Registry(Protocol):
    """The communicator registry of the shared memory file (sidecar/shm.py's `ShmFile`)."""

    def comms(self) -> dict[int, tuple[int, int]]:
        """comm id -> (nranks, nnodes) of every registered communicator."""
        ...


class Fold:
    """One sidecar's fold of ring blocks (the drain loop calls `block` under its lock)."""

    def __init__(
        self,
        shm: Registry,
        *,
        agg: Aggregator,
        baseline: Baseline,
        tuning: BudgetedTuning,
        budget: BudgetGuard,
        steps: StepWatch,
    ) -> None:
        self.shm = shm
        self.agg = agg
        self.baseline = baseline
        self.tuning = tuning
        self.budget = budget
        self.steps = steps
        self._comms: dict[int, tuple[int, int]] = {}
        self._scales: dict[tuple[int, int], int] = {}

    def shape(self, comm_id: int) -> tuple[int, int] | None:
        """(nranks, nnodes) of a communicator; the registry is re-read on a miss."""
        got = self._comms.get(comm_id)
        if got is None:
            self._comms = self.shm.comms()
            got = self._comms.get(comm_id)
        return got

    def scale(self, nranks: int, nnodes: int) -> int:
        """The scale class of a communicator shape (memoized)."""
        got = self._scales.get((nranks, nnodes))
        if got is None:
            got = self._scales[(nranks, nnodes)] = scale_class(nranks, nnodes)
        return got

    def block(
        self,
        slot: int,
        cols: Columns,
        history: History,
        origins: Tally[str],
        skipped: Tally[str],
    ) -> None:
        """Attribute each record of a block and fold it into the aggregates, the NCCL
        baseline, the tuner and the exploration budget (in ring order)."""
        shape_of, scale_of, add = self.shape, self.scale, self.agg.add
        baseline, tuning, budget = self.baseline, self.tuning, self.budget
        for comm_id, nbytes, exec_ns, coll_seq, coll, algo, proto, nch, tag in zip(
            *cols[:8], cols.user_tag, strict=True
        ):
            shape = shape_of(comm_id)
            if shape is None:
                skipped["unregistered_communicator"] += 1
                continue
            if coll > 4 or algo > 6 or proto > 2 or exec_ns == 0:
                skipped["unusable"] += 1
                continue
            nranks, nnodes = shape
            t_us = exec_ns / 1000.0
            a = attribute(
                history, coll, nbytes, nranks, nnodes, coll_seq, algo, proto, nch,
                scale=scale_of(nranks, nnodes),
            )  # fmt: skip
            key = Key(a.table_version, coll, a.bucket, nranks, nnodes, *a.arm, a.origin, tag)
            if not add(key, nbytes, t_us):
                skipped["refused"] += 1
                continue
            origins[a.origin] += 1
            if a.origin == EXPLORE:
                self.steps.explored(slot, comm_id, coll_seq)
            cell = (coll, a.bucket, nranks, nnodes)
            if baseline.is_default(cell, a.arm, a.origin != DEFAULT):
                baseline.observe(cell, t_us)
            tuning.observe(a.scale, coll, a.bucket, nranks, nnodes, a.arm, t_us)
            budget.observe(cell, a.origin, t_us)

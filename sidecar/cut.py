"""Cutting reward batches into the outbox: when a cut is due, and what it writes.

When (the send pacing): a cut is due every `Pace.interval()` seconds (sidecar/pace.py:
the job's size and the ingest's answers set it), or at once when the open
aggregates already fill a batch (`MAX_RECORDS_PER_BATCH`). While `MAX_OUTBOX`
batches wait to be sent the cut pauses and the aggregates keep merging: the
endpoint is behind, and more, smaller batches would not help it. A forced cut
(shutdown, `Runner.once`) ignores both.

What: one batch per table version with open aggregates (the latest committed
version when none are open, so a leader's tuner events still go out), each of
at most `MAX_RECORDS_PER_BATCH` records. Only the epoch leader's batches carry
the tuner's events. Each batch is written into the spool, then the state without
the aggregates it took is saved (sidecar/spool.py, step 2: nothing is lost or
sent twice across a kill).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from pydantic import ValidationError

from dynamiccl.api.rewards import MAX_RECORDS_PER_BATCH, RewardRecord
from dynamiccl.sidecar.aggregate import Aggregator, Key, to_record
from dynamiccl.sidecar.baseline import Baseline
from dynamiccl.sidecar.config import AgentConfig
from dynamiccl.sidecar.explore_budget import BudgetedTuning
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.pace import Pace
from dynamiccl.sidecar.spool import Spool, SpoolState
from dynamiccl.sidecar.step_watch import StepWatch

log = logging.getLogger("dynamiccl.sidecar")

MAX_OUTBOX: Final = 64  # batches waiting before cutting pauses (aggregates keep merging)


class Cutter:
    """One sidecar's cuts (`write` runs under the drain loop's lock)."""

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        agg: Aggregator,
        baseline: Baseline,
        tuning: BudgetedTuning,
        steps: StepWatch,
        spool: Spool,
        state: SpoolState,
        metrics: AgentMetrics,
        pace: Pace,
        persist: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        """`persist`: save the state, then consume the rings (Runner._persist)."""
        self.cfg = cfg
        self.agg, self.baseline, self.tuning, self.steps = agg, baseline, tuning, steps
        self.spool, self.state, self.metrics = spool, state, metrics
        self.pace, self.persist, self.clock = pace, persist, clock
        self.last_cut = clock()

    def due(self, *, force: bool = False) -> bool:
        """Whether a cut is due now (the pacing above); a due cut restarts the interval."""
        now = self.clock()
        due = force or now - self.last_cut >= self.pace.interval()
        if not due and len(self.agg) < MAX_RECORDS_PER_BATCH:
            return False
        if not force and len(self.spool.outbox()) >= MAX_OUTBOX:
            return False  # the endpoint is behind: keep merging into the open aggregates
        self.last_cut = now
        return True

    def write(self, current_version: int, *, leader: bool) -> int:
        """Write the open aggregates (and, for the leader, the tuner's events) as
        batches; returns how many."""
        written = 0
        for v in self.agg.versions() or [current_version]:
            while True:
                items = self.agg.take(MAX_RECORDS_PER_BATCH, table_version=v)
                events = tuple(self.tuning.take_events()) if leader else ()
                records = self.records(items)
                if not records and not events:
                    break
                self._write_batch(v, records, events)
                written += 1
                if len(items) < MAX_RECORDS_PER_BATCH:
                    break
        return written

    def records(self, items: list[tuple[Key, Any]]) -> list[RewardRecord]:
        """The reward records of taken aggregates (an invalid one is logged and counted)."""
        out = []
        for key, st in items:
            shape = (key.coll, key.bucket, key.nranks, key.nnodes)
            try:
                out.append(to_record(key, st, self.baseline.time_us(shape, st.mean_us)))
            except ValidationError as exc:
                log.warning("dropping an aggregate that is not a valid record: %s", exc)
                self.metrics.records_skipped.labels(reason="invalid_record").inc(st.count)
        return out

    def _write_batch(
        self, version: int, records: list[RewardRecord], events: tuple[Any, ...]
    ) -> None:
        seq = self.state.next_seq
        batch = self.cfg.batch(seq, version, records, events)
        batch = batch.model_copy(update={"steps": self.steps.times(version)})  # validated
        self.spool.put_batch(seq, batch.model_dump_json().encode())  # step 2: the batch ...
        self.state.next_seq = seq + 1
        self.persist()  # ... then the state without its aggregates
        self.metrics.batches_cut.inc()
        for ev in events:
            self.metrics.tuner_events.labels(kind=ev.kind.value).inc()

"""The sidecar's loop: shared memory → rewards → ingest, and the epoch protocol beside it.

Three threads:

- the drain loop (the caller's thread): every `drain_s` (at once again when a
  ring was busy) read the rings without consuming them, attribute each record
  (communicator shape from the registry, table and configuration from the
  committed history), fold it into the aggregates, the NCCL baseline and the
  online tuner; when a ring holds `CONSUME_AT` read records or `save_s` passed,
  save the spool's state, then consume the rings (saving once per pass would
  cost more than reading at low rates); every
  `flush_s` (or when a batch is full) cut a batch per table version into the
  outbox (spool.py explains why this order loses and duplicates nothing);
- the sender (sender.SendLoop): outbox → ingest endpoint;
- coordination (coordination.Coordination): every `Settings.step_s`.

Nothing here can stop training: the plugin never waits for the sidecar except
at an epoch boundary of a pending epoch, which the participants resolve.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from dynamiccl.agent import shm as shmlib
from dynamiccl.agent.aggregate import Aggregator, Key, to_record
from dynamiccl.agent.attribution import DEFAULT, EXPLORE, History, attribute
from dynamiccl.agent.config import AgentConfig
from dynamiccl.agent.coordination import Backends, Coordination, Settings
from dynamiccl.agent.exploration import BudgetGuard
from dynamiccl.agent.measurement import MeasurementWatch
from dynamiccl.agent.metrics import AgentMetrics
from dynamiccl.agent.pace import Pace
from dynamiccl.agent.ring import Columns, RingReader
from dynamiccl.agent.sender import Client, Poster, SendLoop
from dynamiccl.agent.shapes import sidecar_tuning
from dynamiccl.agent.spool import Spool, SpoolState
from dynamiccl.agent.step_judge import StepJudge
from dynamiccl.agent.step_watch import StepWatch
from dynamiccl.api.rewards import (
    MAX_RECORDS_PER_BATCH,
    RewardRecord,
)
from dynamiccl.api.table import scale_class

log = logging.getLogger("dynamiccl.agent")

BUSY: Final = shmlib.RING_CAP // 4  # a pass that read this many records loops at once
CONSUME_AT: Final = (
    shmlib.RING_CAP * 3 // 8
)  # save + consume once a ring holds this many read records
MAX_OUTBOX: Final = 64  # batches waiting before cutting pauses (aggregates keep merging)


@dataclass
class Options:
    """Loop timing."""

    drain_s: float = 0.02
    save_s: float = 0.25  # save + consume at least this often while records are read
    flush_s: float = 2.0
    send_grace_s: float = 20.0  # at shutdown: how long to keep sending
    coordination: Settings = field(default_factory=Settings)


class Runner:
    """One sidecar."""

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        backends: Backends | None,
        metrics: AgentMetrics | None = None,
        options: Options | None = None,
        clock: Callable[[], float] = time.monotonic,
        client: Poster | None = None,
    ) -> None:
        """`client`: where batches go (default: the HTTPS client of `cfg.ingest_url`)."""
        self.cfg = cfg
        self.opt = options or Options()
        self.metrics = metrics or AgentMetrics()
        self.clock = clock
        cfg.shm_path.parent.mkdir(parents=True, exist_ok=True)
        shmlib.create(cfg.shm_path, cfg.epoch_interval)
        self.shm = shmlib.ShmFile(cfg.shm_path)
        self.reader = RingReader(cfg.shm_path)
        self.spool = Spool(cfg.state_dir, cfg.pod_uid)
        self.state: SpoolState = self.spool.load()
        self.agg = Aggregator.from_state(self.state.aggregator)
        self.lock = threading.Lock()
        self.budget = BudgetGuard(cfg.exploration.exploration.budget_percent)
        self.baseline, self.tuning = sidecar_tuning(cfg, self.budget, self.metrics)  # shapes.py
        self.baseline.load_state(self.state.baseline)
        self.steps = StepWatch(StepJudge(self.tuning.vetoes))
        self.coordination: Coordination | None = None
        if backends is not None and cfg.table is not None:
            self.coordination = Coordination(
                backends,
                self.shm,
                cfg.pod_name,
                cfg.voters,
                cfg.procs_per_pod,
                cfg.table,
                self.tuning,
                self.lock,
                self.metrics,
                self.opt.coordination,
                clock=clock,
            )
            self.coordination.hold_first = self._hold_first
        if client is None and cfg.ingest_url:
            client = Client(cfg.ingest_url, cfg.token_file, cfg.ca_file)
        pace = Pace(self.opt.flush_s, cfg.voters)  # agent/pace.py: job size, ingest answers
        self.sender = SendLoop(self.spool, client, self.metrics, pace=pace)
        self._comms: dict[int, tuple[int, int]] = {}
        self._scales: dict[tuple[int, int], int] = {}
        self._dropped: dict[int, int] = {}
        self._last_cut = clock()
        self.watch = MeasurementWatch(self.metrics)
        self._last_save = clock()
        self._unconsumed: dict[int, int] = {}  # slot -> records read (folded) but not consumed
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._beat = 0
        self._reconcile_cursors()
        self.metrics.config_ok.set(1)
        tot = self.spool.sent()
        self.metrics.acked_calls.set(tot.calls)
        self.metrics.acked_batches.set(tot.batches)

    # --- startup -------------------------------------------------------------------------
    def _reconcile_cursors(self) -> None:
        """Make the rings agree with the saved cursors (see spool.py, step 1)."""
        for slot, cur in list(self.state.cursors.items()):
            head, tail = self.reader.head(slot), self.reader.tail(slot)
            if cur > head or cur < tail:  # a new file, or positions consumed by someone else
                self.state.cursors[slot] = tail
            elif cur > tail:
                self.reader.consume(slot, cur)  # folded in before the last kill, not yet consumed
        if self.state.recovered_cut:
            log.info("recovered an interrupted cut: next batch %d", self.state.next_seq)
            self._save()

    def _save(self) -> None:
        self.state.aggregator = self.agg.to_state()
        self.state.baseline = self.baseline.to_state()
        self.spool.save(self.state)
        self._last_save = self.clock()

    def _persist(self) -> None:
        """Save the state (cursors + what was folded up to them), then consume the rings."""
        self._save()  # durable first ...
        for slot in self._unconsumed:
            self.reader.consume(slot, self.state.cursors[slot])  # ... then free the ring
        self._unconsumed.clear()

    def _hold_first(self) -> bool:
        """Whether the job's first table waits for NCCL's steps (agent/step_watch.py)."""
        with self.lock:
            return self.steps.holds_first_table(self.cfg.table)

    # --- one pass over the rings ---------------------------------------------------------
    def _shape(self, comm_id: int) -> tuple[int, int] | None:
        got = self._comms.get(comm_id)
        if got is None:
            self._comms = self.shm.comms()
            got = self._comms.get(comm_id)
        return got

    def _scale(self, nranks: int, nnodes: int) -> int:
        got = self._scales.get((nranks, nnodes))
        if got is None:
            got = self._scales[(nranks, nnodes)] = scale_class(nranks, nnodes)
        return got

    def drain_once(self) -> int:
        """Read, attribute, fold, persist, consume; returns the records read."""
        t0 = time.perf_counter()
        history = self.coordination.history if self.coordination else History()
        origins: Tally[str] = Tally()
        skipped: Tally[str] = Tally()
        total = 0
        moved: dict[int, int] = {}
        used, heads, drops = self.reader.scan()
        with self.lock:
            for slot, head_hint in zip(used, heads, strict=True):
                start = self.state.cursors.get(slot)
                if start is None:
                    start = self.state.cursors[slot] = self.reader.tail(slot)
                if head_hint == start:
                    continue  # nothing new in this ring
                batch = self.reader.read(slot, start)
                skipped["unpublished"] += batch.skipped
                self._fold(slot, batch.cols, history, origins, skipped)
                self._find_steps(slot, batch.cols, history)
                total += len(batch)
                if batch.end != start:
                    moved[slot] = batch.end
                    self.state.cursors[slot] = batch.end
            self.steps.check()  # step time judges the tuner's changes (step_judge.py)
        if total:  # a stop reaches the plugin after the next look and an epoch boundary
            self.budget.note_drain(total, self.cfg.epoch_interval * self.cfg.procs_per_pod)
        self._count_drops(used, drops)
        for slot, pos in moved.items():
            self._unconsumed[slot] = pos - self.reader.tail(slot)
        if self._unconsumed and (
            max(self._unconsumed.values()) >= CONSUME_AT
            or self.clock() - self._last_save >= self.opt.save_s
        ):
            self._persist()
        m = self.metrics
        m.records_read.inc(total)
        for o, n in origins.items():
            m.calls.labels(origin=o).inc(n)
        for reason, n in skipped.items():
            m.records_skipped.labels(reason=reason).inc(n)
        m.open_keys.set(len(self.agg))
        m.drain_duration.observe(time.perf_counter() - t0)
        self._beat += 1
        self.shm.set_heartbeat(os.getpid(), self._beat)
        return total

    def _fold(
        self,
        slot: int,
        cols: Columns,
        history: History,
        origins: Tally[str],
        skipped: Tally[str],
    ) -> None:
        """Attribute each record of a block and fold it into the aggregates, the NCCL
        baseline, the tuner and the exploration budget (in ring order)."""
        shape_of, scale_of, add = self._shape, self._scale, self.agg.add
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

    def _find_steps(self, slot: int, cols: Columns, history: History) -> None:
        """The block's records to the slot's step detector (after `_fold`, so the block's
        explored calls are known); the steps they end to the judge."""
        if not cols.comm_id:
            return
        detector = self.steps.detector(slot, self.reader.owner_after_read(slot))
        for step in detector.observe_block(
            cols.comm_id, cols.coll, cols.nbytes, cols.coll_seq, cols.start_ns
        ):
            self.steps.add(slot, step, history)

    def _count_drops(self, used: list[int], drops: list[int]) -> None:
        for slot, d in zip(used, drops, strict=True):
            prev = self._dropped.get(slot)
            if prev is not None and d > prev:
                self.metrics.records_dropped.inc(d - prev)
            self._dropped[slot] = d

    # --- batches -------------------------------------------------------------------------
    def _records(self, items: list[tuple[Key, Any]]) -> list[RewardRecord]:
        out = []
        for key, st in items:
            shape = (key.coll, key.bucket, key.nranks, key.nnodes)
            try:
                out.append(to_record(key, st, self.baseline.time_us(shape, st.mean_us)))
            except ValidationError as exc:
                log.warning("dropping an aggregate that is not a valid record: %s", exc)
                self.metrics.records_skipped.labels(reason="invalid_record").inc(st.count)
        return out

    def cut(self, *, force: bool = False) -> int:
        """Write due batches into the outbox; returns how many."""
        now = self.clock()
        due = force or now - self._last_cut >= self.sender.pace.interval()
        if not due and len(self.agg) < MAX_RECORDS_PER_BATCH:
            return 0
        if not force and len(self.spool.outbox()) >= MAX_OUTBOX:
            return 0  # the endpoint is behind: keep merging into the open aggregates
        self._last_cut = now
        self.watch.check(self.shm.procs())
        leader = self.coordination is not None and self.coordination.leader
        written = 0
        with self.lock:
            versions = self.agg.versions() or [self._current_version()]
            for v in versions:
                while True:
                    items = self.agg.take(MAX_RECORDS_PER_BATCH, table_version=v)
                    events = tuple(self.tuning.take_events()) if leader else ()
                    records = self._records(items)
                    if not records and not events:
                        break
                    self._write_batch(v, records, events)
                    written += 1
                    if len(items) < MAX_RECORDS_PER_BATCH:
                        break
        return written

    def _current_version(self) -> int:
        latest = self.coordination.history.latest if self.coordination else None
        return latest.version if latest is not None else 0

    def _write_batch(
        self, version: int, records: list[RewardRecord], events: tuple[Any, ...]
    ) -> None:
        seq = self.state.next_seq
        batch = self.cfg.batch(seq, version, records, events)
        batch = batch.model_copy(update={"steps": self.steps.times(version)})  # validated
        self.spool.put_batch(seq, batch.model_dump_json().encode())  # step 2: the batch ...
        self.state.next_seq = seq + 1
        self._persist()  # ... then the state without its aggregates
        self.metrics.batches_cut.inc()
        for ev in events:
            self.metrics.tuner_events.labels(kind=ev.kind.value).inc()

    # --- threads -------------------------------------------------------------------------
    def coordinate_once(self) -> None:
        """One step of the coordination thread (a failed step keeps the current table)."""
        assert self.coordination is not None
        try:
            self.coordination.step()
        except Exception as exc:  # the API server or a file: keep the current table
            self.metrics.coordination_errors.inc()
            log.warning("coordination step failed: %s", exc)

    def _coordinate(self) -> None:
        step_s = self.opt.coordination.step_s
        while not self._stop.is_set():
            self.coordinate_once()
            self._stop.wait(step_s)

    def start_threads(self) -> None:
        t = threading.Thread(target=self.sender.run, name="sender", daemon=True)
        self._threads.append(t)
        if self.coordination is not None:
            self._threads.append(
                threading.Thread(target=self._coordinate, name="coordination", daemon=True)
            )
        for t in self._threads:
            t.start()

    def run(self, stop: threading.Event) -> None:
        """Until `stop` is set; then a final drain, cut and send (`shutdown`)."""
        self.start_threads()
        while not stop.is_set():
            try:
                n = self.drain_once()
                self.cut()
            except OSError as exc:  # e.g. the emptyDir is full: nothing consumed, try again
                log.error("drain failed, retrying in 1s: %s", exc)
                stop.wait(1.0)
                continue
            if n < BUSY:
                stop.wait(self.opt.drain_s)
        self.shutdown()

    def shutdown(self) -> None:
        """Stop coordination, drain and cut everything, send for up to `send_grace_s`."""
        self._stop.set()
        self.sender.stop()
        for t in self._threads:
            t.join(10)
        if self.coordination is not None:
            try:
                self.coordination.close()
            except Exception as exc:
                log.warning("lease release failed: %s", exc)
        while self.drain_once():
            pass
        self.cut(force=True)
        if self._unconsumed:
            self._persist()
        self._final_send()

    def _final_send(self) -> None:
        if self.sender.client is not None:

            def pause(seconds: float) -> bool:
                time.sleep(seconds)
                return False

            self.sender.drain(deadline=time.monotonic() + self.opt.send_grace_s, sleep=pause)

    def once(self) -> None:
        """One pass: drain, cut, send (no threads)."""
        while self.drain_once() >= BUSY:
            pass
        self.cut(force=True)
        if self._unconsumed:
            self._persist()
        self._final_send()

    def summary(self) -> dict[str, Any]:
        """What this sidecar measured and sent (the CLI's --json output)."""
        tot = self.spool.sent()
        return {
            "pod": self.cfg.pod_name,
            "acknowledged_batches": tot.batches,
            "acknowledged_calls": tot.calls,
            "acknowledged_records": tot.records,
            "outbox_batches": len(self.spool.outbox()),
            "open_aggregates": len(self.agg),
            "next_sequence": self.state.next_seq,
            "leader": bool(self.coordination and self.coordination.leader),
            "proposed_epochs": list(self.coordination.proposed) if self.coordination else [],
            "committed_epochs": len(self.coordination.history) if self.coordination else 0,
            "last_send_error": self.sender.last_error,
            "unmeasured_processes": self.watch.count,
            **self.tuning.summary(),
            "steps": self.steps.summary(),
        }

    def close(self) -> None:
        self.reader.close()
        self.shm.close()

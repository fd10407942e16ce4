"""The sidecar's loop: shared memory → rewards → ingest, and the epoch protocol beside it.

Three threads:

- the drain loop (the caller's thread): every `drain_s` (at once again when a
  ring was busy) read the rings without consuming them, attribute each record
  (communicator shape from the registry, table and configuration from the
  committed history), fold it into the aggregates, the NCCL baseline and the
  online tuner (fold.py); when a ring holds `CONSUME_AT` read records or `save_s` passed,
  save the spool's state, then consume the rings (saving once per pass would
  cost more than reading at low rates); when a cut is due (cut.py: the send
  pacing) cut a batch per table version into the outbox (spool.py explains why
  this order loses and duplicates nothing);
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

from dynamiccl.sidecar import shm as shmlib
from dynamiccl.sidecar.aggregate import Aggregator
from dynamiccl.sidecar.attribution import History
from dynamiccl.sidecar.config import AgentConfig
from dynamiccl.sidecar.cut import Cutter
from dynamiccl.sidecar.explore_budget import BudgetedTuning, BudgetGuard
from dynamiccl.sidecar.fold import Fold
from dynamiccl.sidecar.measurement import MeasurementWatch
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.pace import Pace
from dynamiccl.sidecar.ring import Columns, RingReader
from dynamiccl.sidecar.sender import Client, Poster, SendLoop
from dynamiccl.sidecar.shapes import sidecar_tuning
from dynamiccl.sidecar.spool import Spool, SpoolState
from dynamiccl.sidecar.step_judge import StepJudge
from dynamiccl.sidecar.step_watch import StepWatch
from dynamiccl.sidecar.table_changes import Backends, Coordination, Settings

log = logging.getLogger("dynamiccl.sidecar")

BUSY: Final = shmlib.RING_CAP // 4  # a pass that read this many records loops at once
CONSUME_AT: Final = (
    shmlib.RING_CAP * 3 // 8
)  # save + consume once a ring holds this many read records


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
        self.baseline, self._tuning = sidecar_tuning(cfg, self.budget, self.metrics)  # shapes.py
        self.baseline.load_state(self.state.baseline)
        self.steps = StepWatch(StepJudge(self.tuning.vetoes))
        self.coordination = self._coordination(backends)
        if client is None and cfg.ingest_url:
            client = Client(cfg.ingest_url, cfg.token_file, cfg.ca_file)
        pace = Pace(self.opt.flush_s, cfg.voters)  # sidecar/pace.py: job size, ingest answers
        self.sender = SendLoop(self.spool, client, self.metrics, pace=pace)
        self._dropped: dict[int, int] = {}
        self.fold, self.cutter = self._fold_and_cut(pace)
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

    @property
    def tuning(self) -> BudgetedTuning:
        """The online tuner (shapes.py) the fold feeds and the cut takes events from."""
        return self._tuning

    @tuning.setter
    def tuning(self, tuning: BudgetedTuning) -> None:
        """A new tuner reaches the fold and the cut too (the coordination keeps its own)."""
        self._tuning = self.fold.tuning = self.cutter.tuning = tuning

    def _coordination(self, backends: Backends | None) -> Coordination | None:
        """The epoch protocol's participant (none without backends or a table)."""
        cfg = self.cfg
        if backends is None or cfg.table is None:
            return None
        coordination = Coordination(
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
            clock=self.clock,
        )
        coordination.hold_first = self._hold_first
        return coordination

    def _fold_and_cut(self, pace: Pace) -> tuple[Fold, Cutter]:
        """Where read records go (fold.py) and how they leave as batches (cut.py)."""
        fold = Fold(
            self.shm,
            agg=self.agg,
            baseline=self.baseline,
            tuning=self.tuning,
            budget=self.budget,
            steps=self.steps,
        )
        cutter = Cutter(
            self.cfg,
            agg=self.agg,
            baseline=self.baseline,
            tuning=self.tuning,
            steps=self.steps,
            spool=self.spool,
            state=self.state,
            metrics=self.metrics,
            pace=pace,
            persist=self._persist,
            clock=self.clock,
        )
        return fold, cutter

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
        """Whether the job's first table waits for NCCL's steps (sidecar/step_watch.py)."""
        with self.lock:
            return self.steps.holds_first_table(self.cfg.table)

    # --- one pass over the rings ---------------------------------------------------------
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
                self.fold.block(slot, batch.cols, history, origins, skipped)
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

    def _find_steps(self, slot: int, cols: Columns, history: History) -> None:
        """The block's records to the slot's step detector (after the fold, so the block's
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
    def cut(self, *, force: bool = False) -> int:
        """Write due batches into the outbox (cut.py); returns how many."""
        if not self.cutter.due(force=force):
            return 0
        self.watch.check(self.shm.procs())
        leader = self.coordination is not None and self.coordination.leader
        with self.lock:
            return self.cutter.write(self._current_version(), leader=leader)

    def _current_version(self) -> int:
        latest = self.coordination.history.latest if self.coordination else None
        return latest.version if latest is not None else 0

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

"""The sidecar's side of in-run table changes: join, vote, lead, propose, follow.

Every sidecar of a job, once per step:

1. creates the job's epoch record if it is the first (it joins through its
   ballot: the proposer adds a late pod, aborting a pending epoch first, `tally.joined`);
2. tries to hold the proposer lease (`leader.Lease`); the holder reads the pods'
   ballots, closes votes (`Coordinator.step`) and proposes: first the job's initial table, later the
   online tuner's preferred table when it changed materially
   (`Tuning.signature`), at most every `min_interval_s` (a round: the tuners fold
   their measurements then, `Tuning.end_round`), never while an epoch
   is pending, never before every voter's processes crossed their first
   boundary, after an aborted epoch only with exponential backoff, and only
   when the next epoch's table slot is free (`epoch.slot_free`: the epoch 63
   before it is used or needed by no process), so a job never runs out of epochs;
3. runs its `Participant` (mirror outcomes into shared memory, vote on the
   pending epoch in its ballot, abort one its processes waited on for too long);
4. refreshes the committed history the drain loop attributes records with.

Nothing here touches the plugin's decisions outside an agreed epoch: tables
reach shared memory only through `Participant` for epochs of the record.
The lead (how many intervals ahead of the fastest reported process an epoch
takes effect) follows the measured progress rate, so the votes have
`lead_time_s` to close before any process reaches the boundary.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.epoch import (
    EpochRecord,
    EpochStatus,
    next_epoch,
    slot_free,
)
from dynamiccl.api.table import DecisionTable
from dynamiccl.sidecar.attribution import History, TableView
from dynamiccl.sidecar.ballots import BallotBox
from dynamiccl.sidecar.cas import CASStore, load_record
from dynamiccl.sidecar.explore_budget import BudgetedTuning, without_exploration
from dynamiccl.sidecar.leader import Lease
from dynamiccl.sidecar.metrics import AgentMetrics
from dynamiccl.sidecar.participant import Participant
from dynamiccl.sidecar.proposer import Coordinator, TableStore, init_record
from dynamiccl.sidecar.shm import ShmFile
from dynamiccl.sidecar.tuning import Tuning

log = logging.getLogger("dynamiccl.sidecar.table_changes")

MAX_RETRY_S: Final = 600.0
LEAD_STEPS: Final = 10  # the wanted lead time and abort retry, in coordination steps
RATE_WINDOW_S: Final = 0.5  # progress watched before the first proposal (the call rate)


@dataclass(frozen=True)
class Backends:
    """Where the job's record, lease, tables and ballots live (None: beside a file record,
    `ballots.file_ballots`)."""

    record: CASStore
    lease: CASStore
    tables: TableStore
    ballots: BallotBox | None = None


@dataclass(frozen=True)
class Settings:
    """Timing of the protocol."""

    step_s: float = 0.5
    lease_s: float = 15.0
    min_interval_s: float = 30.0  # between two tuner proposals
    escape_interval_s: float = 5.0  # between two when a cell's escape is due (`_escape_due`)
    retry_s: float = 5.0  # after an aborted proposal
    lead_time_s: float = 5.0  # wanted time between proposal and boundary
    min_lead: int = 4
    abort_after_s: float = 4.0

    @classmethod
    def for_backend(
        cls, kube: bool, step_s: float | None = None, min_interval_s: float = 30.0
    ) -> Settings:
        """`dynamiccl sidecar`'s timing: a step of 0.5 s on Kubernetes, 0.05 s with files.

        Votes close within a few steps of every sidecar, so the wanted lead is
        `LEAD_STEPS` steps (5 s on Kubernetes, 0.5 s with files): processes do
        not wait at the boundary, and the first table is not pushed late into a
        short run. An aborted epoch is retried after as long (then with
        exponential backoff).
        """
        step = step_s or (0.5 if kube else 0.05)
        wait = LEAD_STEPS * step
        return cls(
            step_s=step,
            min_interval_s=min_interval_s,
            escape_interval_s=min(wait, min_interval_s),
            lead_time_s=wait,
            retry_s=wait,
        )


class Coordination:
    """One sidecar's coordination state; `step()` from one thread."""

    def __init__(  # noqa: PLR0917
        self,
        backends: Backends,
        shm: ShmFile,
        voter: str,
        voters: int,
        procs_per_pod: int,
        base_table: DecisionTable | None,
        tuning: Tuning,
        lock: threading.Lock,
        metrics: AgentMetrics,
        settings: Settings = Settings(),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.b = backends
        self.shm = shm
        self.voter = voter
        self.voters = voters
        self.base = base_table
        self.tuning = tuning
        self.lock = lock
        self.metrics = metrics
        self.s = settings
        self.clock = clock
        self.participant = Participant(
            backends.record,
            backends.tables,
            shm,
            voter,
            expected_procs=procs_per_pod,
            abort_after_s=settings.abort_after_s,
            clock=clock,
            ballots=backends.ballots,
            report_s=max(settings.step_s, settings.lead_time_s / 2),
        )
        self.coordinator = Coordinator(
            backends.record, backends.tables, settings.min_lead, backends.ballots
        )
        self.lease = Lease(backends.lease, voter, settings.lease_s, wall)
        self.history = History()
        self._history_key = (0, 0)  # (committed epochs kept, the latest's number)
        self.leader = False
        self._views: dict[tuple[int, int], TableView] = {}
        self._progress: deque[tuple[float, int]] = deque(maxlen=64)
        self._last_proposal = -math.inf
        self._last_round = -math.inf  # the tuners' last fold (`Tuning.end_round`)
        self._proposed_sig: tuple[object, ...] | None = None
        self._proposed_gate: bool | None = None  # the budget's gate when the last table went out
        self.proposed: list[int] = []  # epochs this sidecar proposed
        self.hold_first: Callable[[], bool] = lambda: False  # the first table waits (runner)

    # --- one step ---------------------------------------------------------------------
    def step(self) -> None:
        rec, _ = load_record(self.b.record)
        if rec is None:
            rec = init_record(self.b.record, self.shm.interval, (self.voter,))
        self.leader = self.lease.step()
        self.metrics.leader.set(1 if self.leader else 0)
        if self.leader:
            rec = self.coordinator.step({self.voter: self.participant.ballot}) or rec
            self._maybe_propose(rec)
        else:
            with self.lock:
                self._end_round(self.clock())
        self.participant.step()  # votes on what was just proposed, mirrors outcomes
        rec, _ = load_record(self.b.record)
        if rec is not None:
            self._refresh_history(rec)

    def close(self) -> None:
        """Hand the lease over (clean shutdown)."""
        if self.leader:
            self.lease.release()
            self.leader = False
            self.metrics.leader.set(0)

    # --- proposals --------------------------------------------------------------------
    def _lead(self, rec: EpochRecord) -> int | None:
        """Intervals ahead of the fastest process, or None while the call rate is unknown.

        Proposing blind (a fixed minimum lead) lets fast processes cross the
        boundary before the votes close: the epoch aborts and is retried only
        after `retry_s`. So nothing is proposed until this sidecar has watched
        every pod's processes run for `RATE_WINDOW_S`.
        """
        top = max(rec.reported.values(), default=0)
        now = self.clock()
        if not self._progress or self._progress[-1][1] != top:
            self._progress.append((now, top))
        t0, k0 = self._progress[0]
        if now - t0 < RATE_WINDOW_S:
            return None
        rate = (top - k0) / (now - t0)
        return max(self.s.min_lead, math.ceil(rate * self.s.lead_time_s / rec.interval))

    def _running(self, rec: EpochRecord) -> bool:
        """Every pod joined and its processes run: they crossed their first boundary."""
        if len(rec.voters) < self.voters:
            return False
        return all(rec.reported.get(v, 0) >= rec.interval for v in rec.voters)

    def _maybe_propose(self, rec: EpochRecord) -> None:
        running = self._running(rec)
        if not running:
            # the rate is measured while every pod's processes run: before that (start-up,
            # a pod still pulling its image) it says nothing about how fast they will go
            self._progress.clear()
        lead = self._lead(rec)
        if lead is None or not running or self.base is None:
            return
        if rec.pending is not None or not slot_free(rec, next_epoch(rec)):
            return
        now = self.clock()
        last = rec.epochs[-1] if rec.epochs else None
        aborts = last.attempt if last is not None and last.status == EpochStatus.ABORTED else 0
        if aborts:
            self._proposed_sig = None  # the aborted table is wanted again
            wait = min(self.s.retry_s * 2 ** (aborts - 1), MAX_RETRY_S)
            if now - self._last_proposal < wait:
                return
        gate = self._gate()
        flip = gate is not None and gate != self._proposed_gate
        if any(e.status == EpochStatus.COMMITTED for e in rec.epochs):
            # a flip of the budget's gate goes out at once: the budget counts on it
            early = False
            if not flip and now - self._last_proposal < self.s.min_interval_s:
                if not self._escape_due(now):
                    return
                early = True  # a cell's committed choice measured far behind a look
            top = max(e.table_version for e in rec.epochs)
            version = max(top, self.base.version) + 1
            table: DecisionTable | None = None
            if flip and self._last_round == -math.inf:
                table = self._initial(gate, version)  # nothing tuned yet: the job's own table
            else:
                with self.lock:
                    self._end_round(now, early)  # the tuners plan the round this table would start
                    sig = self.tuning.signature()
                    if not sig or sig == self._proposed_sig:
                        return  # nothing learned (yet, or since this sidecar started)
                    table = self.tuning.table(version)
                self._proposed_sig = sig
            if table is None:
                return
        else:
            if self.hold_first():
                return  # NCCL's own steps are measured first (sidecar/step_watch.py)
            table = self._initial(gate, self.base.version)  # first: the job's initial table
        self._proposed_gate = gate
        self.coordinator.lead = lead
        epoch = self.coordinator.publish(table)
        self._last_proposal = now
        if epoch is not None:
            self.proposed.append(epoch)
            self.metrics.epochs_proposed.inc()
            log.info("proposed table %d as epoch %d (lead %d)", table.version, epoch, lead)

    def _gate(self) -> bool | None:
        """Whether the job's exploration budget lets it explore now (None: no budget)."""
        return not self.tuning.guard.exhausted if isinstance(self.tuning, BudgetedTuning) else None

    def _initial(self, gate: bool | None, version: int) -> DecisionTable:
        """The job's initial table under `version`, without exploration while the budget's
        gate is closed (it starts closed: a job explores only once it has earned the cost)."""
        assert self.base is not None
        table = self.base if gate is not False else without_exploration(self.base)
        return table if table.version == version else table.model_copy(update={"version": version})

    def _escape_due(self, now: float) -> bool:
        """Whether the next round starts before `min_interval_s`: a cell's look measured an
        arm far ahead of the committed one (`Tuning.escape_due`), and `escape_interval_s`
        passed since the last proposal (epochs are recycled, `slot_free`, but each costs
        the job a vote)."""
        if now - self._last_proposal < self.s.escape_interval_s:
            return False
        with self.lock:
            return self.tuning.escape_due()

    def _end_round(self, now: float, early: bool = False) -> None:
        """Once per `min_interval_s` (a round; the caller holds the lock): the tuners fold
        their measurements (sidecar/tuning.py `Tuning.end_round`), even when no table follows;
        the leader right before it proposes, every other sidecar on its own clock, so that
        what its tuner finds (guardrail reverts, changes) is reported too. `early` (a cell's
        escape is due): only the due cells fold, their calls stretched to a full round's
        (the round so far began at the last fold or proposal); the round's clock runs on."""
        if early:
            began = max(self._last_round, self._last_proposal)
            self.tuning.end_round(stretch=self.s.min_interval_s / max(now - began, self.s.step_s))
        elif now - self._last_round >= self.s.min_interval_s:
            self.tuning.end_round()
            self._last_round = now

    # --- what the drain loop attributes with -----------------------------------------------
    def _refresh_history(self, rec: EpochRecord) -> None:
        committed = [e for e in rec.epochs if e.status == EpochStatus.COMMITTED]
        key = (len(committed), committed[-1].epoch if committed else 0)
        if key == self._history_key:
            return  # (the record keeps the last KEPT_EPOCHS: the count alone stops growing)
        pairs = []
        for e in committed:
            key = (e.table_version, e.table_digest)
            view = self._views.get(key)
            if view is None:
                table = self.b.tables.get(e.table_version)
                if table is None or table.digest != e.table_digest:
                    return  # try again next step
                view = self._views[key] = TableView(table)
            pairs.append((e.boundary, view))
        self.history = History(pairs)
        self._history_key = key
        self.metrics.committed_epochs.set(key[1])  # numbered 1, 2, ...: one per commit
        self.metrics.table_version.set(pairs[-1][1].version if pairs else 0)

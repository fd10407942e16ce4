"""The sidecar's part of the epoch protocol: mirror the record into shared memory and vote.

For the pending epoch e with boundary K the sidecar (1) writes e's table into its
write-once slot, (2) stores PENDING(e, K) into the control region (seq_cst),
then (3) reads every process's published boundary (seq_cst) and votes YES only
if all expected processes are registered and none reached K.  The plugin
publishes its boundary before reading the entries, so either this check sees a
process at K (vote NO) or that process sees PENDING and waits at K for the
outcome.  Outcomes (COMMITTED / ABORTED) are copied into the control region as
soon as the record shows them; a sidecar whose processes wait at K for longer
than `abort_after_s` aborts the epoch through the CAS (never the plugin).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

from dynamiccl.agent.cas import CASStore, load_record, update_record
from dynamiccl.agent.coordinator import TableStore
from dynamiccl.agent.shm import (
    EPOCH_ABORTED,
    EPOCH_COMMITTED,
    EPOCH_NONE,
    EPOCH_PENDING,
    ShmFile,
    TableSlotError,
)
from dynamiccl.agent.shm_table import encode_table
from dynamiccl.api.epoch import Epoch, EpochRecord, EpochStatus, abort, report, resolve, vote

log = logging.getLogger("dynamiccl.agent.participant")

# A pod whose processes keep the table from taking effect for this many epochs in a row is
# warned about (a few such votes are normal while the ranks start)
WARN_AFTER_NO_VOTES = 3

_LOCAL = {
    EpochStatus.PENDING: EPOCH_PENDING,
    EpochStatus.COMMITTED: EPOCH_COMMITTED,
    EpochStatus.ABORTED: EPOCH_ABORTED,
}


def _vote_no(rec: EpochRecord, *, voter: str, epoch: int) -> EpochRecord:
    return resolve(vote(rec, voter, epoch, False))


class Participant:
    """One pod's voter."""

    def __init__(  # noqa: PLR0917
        self,
        store: CASStore,
        tables: TableStore,
        shm: ShmFile,
        voter: str,
        expected_procs: int,
        abort_after_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.tables, self.shm, self.voter = store, tables, shm, voter
        self.expected_procs = expected_procs
        self.abort_after_s = abort_after_s
        self.clock = clock
        self._waiting_since: dict[int, float] = {}
        self._no_votes = 0  # consecutive no votes of this pod

    def _local_ready(self, ep: Epoch) -> bool:
        """Write the table, then PENDING; False (a no vote) if that is impossible."""
        if ep.boundary % self.shm.interval:
            return False  # the file's L does not divide the record's boundaries
        table = self.tables.get(ep.table_version)
        if table is None or table.digest != ep.table_digest:
            return False
        try:
            self.shm.write_table(ep.epoch, encode_table(table, ep.epoch))
        except TableSlotError:
            return False  # the slot already holds another table: never overwrite it
        self.shm.set_entry(ep.epoch, EPOCH_PENDING, ep.boundary)
        return True

    def _max_boundary(self) -> tuple[int, int]:
        procs = self.shm.procs()
        return len(procs), max((p.max_boundary for p in procs), default=0)

    def step(self) -> None:
        """One round: mirror outcomes, prepare and vote on the pending epoch, report progress."""
        rec, _ = load_record(self.store)
        if rec is None:
            return
        blocked = False
        for ep in rec.epochs:
            if blocked or ep.boundary % self.shm.interval:
                # the file's L cannot express this boundary: the plugin stops reading entries
                # here, so this voter says no to this epoch and to every later one
                blocked = True
                if ep.status == EpochStatus.PENDING and self.voter not in ep.votes:
                    no = partial(_vote_no, voter=self.voter, epoch=ep.epoch)
                    update_record(self.store, no)
                continue
            status, _k = self.shm.entry(ep.epoch)
            if ep.status == EpochStatus.PENDING:
                self._pending(ep, status)
            elif status != _LOCAL[ep.status]:
                if ep.status == EpochStatus.COMMITTED and status == EPOCH_NONE:
                    self._local_ready(ep)  # shm was recreated: restore the table first
                self.shm.set_entry(ep.epoch, _LOCAL[ep.status], ep.boundary)
        _n, top = self._max_boundary()
        update_record(self.store, lambda r: report(r, self.voter, top))

    def _explain(self, yes: bool, ready: bool, n: int, top: int, ep: Epoch) -> None:
        """Say why this pod voted no; warn when its votes keep every table out."""
        self._no_votes = 0 if yes else self._no_votes + 1
        if yes:
            return
        if not ready:
            why = f"table {ep.table_version} not prepared (missing, another digest, slot taken)"
        elif n != self.expected_procs:
            why = (
                f"{n} of the {self.expected_procs} NCCL processes this pod should run"
                " (the job's processes per pod) have mapped the shared-memory file"
            )
        else:
            why = f"a process is at call {top}, past the boundary {ep.boundary}"
        log.info("voted no on epoch %d: %s", ep.epoch, why)
        if self._no_votes == WARN_AFTER_NO_VOTES:
            log.warning(
                "this pod voted no on %d epochs in a row, so the job runs without its table"
                " (NCCL decides); last: %s",
                self._no_votes,
                why,
            )

    def _pending(self, ep: Epoch, status: int) -> None:
        e, k = ep.epoch, ep.boundary
        ready = status == EPOCH_PENDING or (status == EPOCH_NONE and self._local_ready(ep))
        if self.voter not in ep.votes:
            n, top = self._max_boundary()  # read after PENDING was stored (seq_cst)
            yes = ready and n == self.expected_procs and top < k
            update_record(self.store, lambda r: resolve(vote(r, self.voter, e, yes)))
            self._explain(yes, ready, n, top, ep)
        else:
            update_record(self.store, resolve)
        _n, top = self._max_boundary()
        if top >= k and ready:
            since = self._waiting_since.setdefault(e, self.clock())
            if self.clock() - since >= self.abort_after_s:
                reason = f"{self.voter}: processes waited {self.abort_after_s}s at {k}"
                update_record(self.store, lambda r: abort(r, e, reason))

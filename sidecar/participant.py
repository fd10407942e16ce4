"""The sidecar's part of the epoch protocol: mirror the record into shared memory and vote.

For the pending epoch e with boundary K the sidecar (1) takes e's table slot
(`slot_of(e)`: WRITING, sequence word, PENDING(K), all seq_cst; the slot's table
bytes stay those of the epoch it held), then (2) reads every live process's
published boundary and needs words (seq_cst) and votes YES only if all expected
processes are registered and alive (each holds its slot's lease, an OFD lock the
kernel drops when the process is gone: `ShmFile.procs`), none reached K, and,
when e takes the slot of epoch e - 63, no communicator uses or needs that epoch
any more.  The plugin publishes its boundary and its needs before reading a
slot, so either this check sees a process at K (or needing e - 63: vote NO) or
that process sees e's slot in transition and waits for the outcome.  Outcomes
(COMMITTED / ABORTED) are copied into the control region as soon as the record
shows them: a committed epoch's table is written into the slot first (kept in
memory since the yes vote), then COMMITTED; an aborted epoch that had taken a
slot gives it back to the epoch it held, whose table never left the slot.  A
sidecar whose processes wait at K for longer than `abort_after_s` (counted per
attempt: an aborted number comes back with a later K) aborts the epoch through
the CAS (never the plugin).

The vote and the reports go into the pod's ballot (`dynamiccl.sidecar.ballots`, one key of
its group's object), which the proposer folds into the record: a pod never writes the
record to vote, so 2 000 pods do not contend for one object.  The ballot is written when
it changes what the proposer decides: a vote, the needs, the first boundary crossed,
otherwise the progress at most every `report_s`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from dynamiccl.api.epoch import (
    KEPT_EPOCHS,
    Epoch,
    EpochRecord,
    EpochStatus,
    abort,
)
from dynamiccl.sidecar.ballots import Ballot, BallotBox, Vote, file_ballots
from dynamiccl.sidecar.cas import CASStore, load_record, update_record
from dynamiccl.sidecar.proposer import TableStore
from dynamiccl.sidecar.shm import (
    EPOCH_ABORTED,
    EPOCH_COMMITTED,
    EPOCH_PENDING,
    ShmFile,
    slot_of,
)
from dynamiccl.sidecar.shm_table import TABLE_READY, encode_table

log = logging.getLogger("dynamiccl.sidecar.participant")

# A pod whose processes keep the table from taking effect for this many epochs in a row is
# warned about (a few such votes are normal while the ranks start)
WARN_AFTER_NO_VOTES = 3
REPORT_S = 5.0  # progress alone is written to the ballot at most this often

_LOCAL = {
    EpochStatus.PENDING: EPOCH_PENDING,
    EpochStatus.COMMITTED: EPOCH_COMMITTED,
    EpochStatus.ABORTED: EPOCH_ABORTED,
}


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
        ballots: BallotBox | None = None,
        report_s: float = REPORT_S,
    ) -> None:
        self.store, self.tables, self.shm, self.voter = store, tables, shm, voter
        self.expected_procs = expected_procs
        self.abort_after_s = abort_after_s
        self.clock = clock
        self.ballots = ballots if ballots is not None else file_ballots(store)
        self.report_s = report_s
        # what this pod says (a restarted sidecar keeps the vote it cast), and as last written
        self.ballot: Ballot = self._stored() or Ballot()
        self._cast: Ballot | None = None
        self._cast_at = -math.inf
        # when this pod's processes began to wait at the pending epoch's boundary, per attempt
        # (epoch, K): an aborted epoch's number comes back with a later K and a fresh grace
        self._waiting_since: dict[tuple[int, int], float] = {}
        self._no_votes = 0  # consecutive no votes of this pod
        self._images: dict[tuple[int, int, int], bytes] = {}  # (epoch, version, digest)

    def _stored(self) -> Ballot | None:
        """This pod's ballot as stored. Unreadable (the API server down, the ballot objects
        not granted yet): none, and the first vote is cast afresh, which is as safe (a vote
        is taken after the slot, from the processes' state then)."""
        try:
            return self.ballots.mine(self.voter)
        except Exception as exc:  # any backend's error: start without it
            log.warning("cannot read this pod's ballot (%s): starting without it", exc)
            return None

    def _image(self, ep: Epoch) -> bytes | None:
        """`ep`'s table image (kept from the vote to the commit), None if the table store
        does not have its table."""
        key = (ep.epoch, ep.table_version, ep.table_digest)
        if key not in self._images:
            table = self.tables.get(ep.table_version)
            if table is None or table.digest != ep.table_digest:
                return None
            self._images[key] = encode_table(table, ep.epoch)
        return self._images[key]

    def _holds_image(self, ep: Epoch) -> bool:
        state, held, version, digest = self.shm.image_header(ep.epoch)
        return (state, held, version, digest) == (
            TABLE_READY,
            ep.epoch,
            ep.table_version,
            ep.table_digest,
        )

    def _needs(self) -> tuple[int, int, int]:
        """(live processes, highest boundary, oldest epoch a communicator uses or needs: 0 if
        some communicator could not say, -1 if none did), each word read seq_cst.  A process
        whose lease is gone counts for nothing: a killed rank's slot (and the needs words it
        left) never holds a table slot or a vote, and its restarted self registers anew."""
        procs = [p for p in self.shm.procs() if p.alive]
        needs = [v for p in procs for v in p.needs if v]
        low = 0 if any(p.need_overflow for p in procs) else min(needs, default=-1)
        return len(procs), max((p.max_boundary for p in procs), default=0), low

    def _mirror(self, rec: EpochRecord) -> None:
        """Make every slot hold what the record says: the latest kept epoch of that slot (an
        aborted epoch never displaces an older one: the slot goes back to it)."""
        want: dict[int, Epoch] = {}
        for ep in rec.epochs:
            if ep.boundary % self.shm.interval:
                break  # blocked: neither it nor any later epoch (step() votes no on them)
            s = slot_of(ep.epoch)
            if ep.status != EpochStatus.ABORTED or s not in want:
                want[s] = ep
        for ep in want.values():
            self._mirror_slot(ep)
        pending = rec.pending
        for key in [k for k in self._images if pending is None or k[0] != pending.epoch]:
            del self._images[key]  # written (committed) or never to be (aborted)

    def _mirror_slot(self, ep: Epoch) -> None:
        """One slot: its words (sequence word, entry) and, for a committed epoch, its table,
        written while the words still say PENDING (a table reaches the slot only once its
        epoch committed, so a reuse that aborts leaves the kept epoch's table untouched)."""
        held, status, k = self.shm.slot(ep.epoch)
        local = _LOCAL[ep.status]
        if ep.status == EpochStatus.COMMITTED and not self._holds_image(ep):
            image = self._image(ep)
            if image is None:
                log.warning("cannot write epoch %d's table %d", ep.epoch, ep.table_version)
                return  # its processes wait at its boundary until the table can be read
            if held != ep.epoch or status not in (EPOCH_PENDING, EPOCH_ABORTED):
                self.shm.take_slot(ep.epoch, EPOCH_PENDING, ep.boundary)
            self.shm.put_image(ep.epoch, image)
            held, status, k = ep.epoch, EPOCH_PENDING, ep.boundary
        if held != ep.epoch or status not in _LOCAL.values():
            self.shm.take_slot(ep.epoch, local, ep.boundary)
        elif (status, k) != (local, ep.boundary):
            self.shm.set_entry(ep.epoch, local, ep.boundary)

    def step(self) -> None:
        """One round: mirror the record, vote on the pending epoch, report progress and needs."""
        rec, _ = load_record(self.store)
        if rec is None:
            return
        pending = rec.pending
        blocked = next((e for e in rec.epochs if e.boundary % self.shm.interval), None)
        if blocked is not None and pending is not None and pending.epoch >= blocked.epoch:
            # the file's L cannot express this boundary: the plugin stops reading epochs
            # here, so this voter says no to this epoch and to every later one
            self._vote(pending, False, f"boundary {blocked.boundary} is not a multiple of L")
        self._mirror(rec)
        if pending is not None and blocked is None:
            self._pending(pending)
        _n, top, low = self._needs()
        need = low if low >= 0 else max((e.epoch for e in rec.epochs), default=0) + 1
        self.ballot = self.ballot.model_copy(update={"reported": top, "needs": need})
        self._flush(rec.interval)

    def _vote(self, ep: Epoch, yes: bool, reason: str = "") -> None:
        """This pod's first vote on this attempt of `ep` (later ones never change it)."""
        if self.ballot.vote is None or not self.ballot.vote.on(ep):
            v = Vote(epoch=ep.epoch, boundary=ep.boundary, digest=ep.table_digest, yes=yes)
            self.ballot = self.ballot.model_copy(
                update={"vote": v.model_copy(update={"reason": reason[:256]})}
            )

    def voted(self, ep: Epoch) -> bool | None:
        """This pod's vote on this attempt of `ep` (None: not cast)."""
        v = self.ballot.vote
        return v.yes if v is not None and v.on(ep) else None

    def _flush(self, interval: int) -> None:
        """Write the ballot if the proposer needs what changed (see the module's doc)."""
        old, new, now = self._cast, self.ballot, self.clock()
        if old == new:
            return
        urgent = (
            old is None
            or old.vote != new.vote
            or old.needs != new.needs
            or (old.reported < interval <= new.reported)
        )
        if urgent or now - self._cast_at >= self.report_s:
            self.ballots.cast(self.voter, new)
            self._cast, self._cast_at = new, now

    def _explain(  # noqa: PLR0917 -- the vote's inputs
        self, yes: bool, ready: bool, n: int, top: int, ep: Epoch, free: bool
    ) -> str:
        """Say why this pod voted no (returned too); warn when its votes keep every table out."""
        self._no_votes = 0 if yes else self._no_votes + 1
        if yes:
            return ""
        if not ready:
            why = f"table {ep.table_version} not prepared (missing, another digest, slot taken)"
        elif n != self.expected_procs:
            why = (
                f"{n} of the {self.expected_procs} NCCL processes this pod should run"
                " (the job's processes per pod) have mapped the shared-memory file"
            )
        elif not free:
            why = f"a communicator still uses or needs epoch {ep.epoch - KEPT_EPOCHS}"
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
        return why

    def _pending(self, ep: Epoch) -> None:
        e, k = ep.epoch, ep.boundary
        held, status, _k = self.shm.slot(e)
        ready = held == e and status == EPOCH_PENDING and self._image(ep) is not None
        if self.voted(ep) is None:
            n, top, low = self._needs()  # read after the slot was taken (seq_cst)
            gone = e - KEPT_EPOCHS
            free = gone < 1 or low < 0 or low > gone
            yes = ready and n == self.expected_procs and top < k and free
            self._vote(ep, yes, self._explain(yes, ready, n, top, ep, free))
        _n, top, _low = self._needs()
        if top >= k and ready:
            since = self._waiting_since.setdefault((e, k), self.clock())
            for old in [a for a in self._waiting_since if a != (e, k)]:
                del self._waiting_since[old]  # attempts no longer pending
            if self.clock() - since >= self.abort_after_s:
                reason = f"{self.voter}: processes waited {self.abort_after_s}s at {k}"
                update_record(self.store, lambda r: abort(r, e, reason))

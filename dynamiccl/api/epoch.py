"""The durable epoch record of the plugin's agreement protocol (docs/plugin.md).

One record per job, changed only by compare-and-swap.  Epoch ``e`` says "table
``table_version`` (digest ``table_digest``) takes effect at per-communicator call
index ``boundary``".  Epochs are numbered 1, 2, ... for the whole job; an aborted
epoch's number is proposed again (with a later boundary), and the record keeps the
last `KEPT_EPOCHS` committed epochs: the plugin keeps that many tables (one slot each),
and epoch n + KEPT_EPOCHS takes epoch n's slot once no process of any pod uses or
needs epoch n any more (each voter reports its pod's oldest such epoch, `needs`).
The transitions are pure functions here; the coordinator
(``dynamiccl.sidecar.proposer``) and the sidecars (``dynamiccl.sidecar.participant``)
apply them through a CAS store, which makes every outcome unique.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

KEPT_EPOCHS: Final = 63  # table slots of the shared-memory file: committed epochs kept at once
MAX_EPOCH_NUMBER: Final = (1 << 32) - 1  # the plugin's epoch numbers are 32-bit


class EpochStatus(StrEnum):
    """PENDING until every voter said yes (COMMITTED) or anyone aborted it (ABORTED)."""

    PENDING = "pending"
    COMMITTED = "committed"
    ABORTED = "aborted"


class Epoch(BaseModel):
    """One proposal and its outcome."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epoch: int = Field(ge=1, le=MAX_EPOCH_NUMBER)
    boundary: int = Field(ge=1)
    table_version: int = Field(ge=1)
    table_digest: int = Field(ge=0)
    status: EpochStatus = EpochStatus.PENDING
    votes: dict[str, bool] = Field(default_factory=dict)
    reason: str = ""
    attempt: int = Field(default=1, ge=1)  # proposals of this number so far (aborts + 1)


class EpochRecord(BaseModel):
    """The job's kept epochs plus the voters' latest reports: the highest boundary their
    processes reached, and the oldest epoch those processes use or still need."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval: int = Field(ge=64, le=1 << 24)
    voters: tuple[str, ...] = Field(min_length=1)
    epochs: tuple[Epoch, ...] = ()
    reported: dict[str, int] = Field(default_factory=dict)
    needs: dict[str, int] = Field(default_factory=dict)

    @property
    def pending(self) -> Epoch | None:
        """The open proposal, if any (at most one, always the last)."""
        if self.epochs and self.epochs[-1].status == EpochStatus.PENDING:
            return self.epochs[-1]
        return None


class ProposalError(ValueError):
    """A proposal is not possible now (one is pending, or its slot is still needed)."""


def _replace_last(rec: EpochRecord, ep: Epoch) -> EpochRecord:
    return rec.model_copy(update={"epochs": (*rec.epochs[:-1], ep)})


def next_epoch(rec: EpochRecord) -> int:
    """The number the next proposal gets: an aborted last epoch's again, else one more."""
    if not rec.epochs:
        return 1
    last = rec.epochs[-1]
    return last.epoch if last.status == EpochStatus.ABORTED else last.epoch + 1


def slot_free(rec: EpochRecord, epoch: int) -> bool:
    """Whether `epoch` may take its slot: it is among the first KEPT_EPOCHS, or every voter
    reported that its processes no longer use or need the epoch KEPT_EPOCHS before it."""
    gone = epoch - KEPT_EPOCHS
    return gone < 1 or all(rec.needs.get(v, 0) > gone for v in rec.voters)


def propose(rec: EpochRecord, table_version: int, table_digest: int, lead: int = 4) -> EpochRecord:
    """Open the next epoch (replacing an aborted last one) at the first multiple of L at
    least `lead` intervals past every report and past the last boundary."""
    if rec.pending is not None:
        raise ProposalError(f"epoch {rec.pending.epoch} is still pending")
    n = next_epoch(rec)
    if n > MAX_EPOCH_NUMBER:
        raise ProposalError(f"epoch numbers exhausted ({n - 1}): the job keeps its table")
    if not slot_free(rec, n):
        raise ProposalError(f"epoch {n - KEPT_EPOCHS}'s slot is still needed by a process")
    step = rec.interval
    ahead = max(rec.reported.values(), default=0) + lead * step
    boundary = max(ahead, rec.epochs[-1].boundary + step if rec.epochs else step)
    boundary = -(-boundary // step) * step
    aborted = bool(rec.epochs) and rec.epochs[-1].status == EpochStatus.ABORTED
    ep = Epoch(
        epoch=n,
        boundary=boundary,
        table_version=table_version,
        table_digest=table_digest,
        attempt=rec.epochs[-1].attempt + 1 if aborted else 1,
    )
    kept = rec.epochs[:-1] if aborted else rec.epochs
    return rec.model_copy(update={"epochs": (*kept, ep)})


def vote(rec: EpochRecord, voter: str, epoch: int, yes: bool) -> EpochRecord:
    """Record `voter`'s first vote on the pending `epoch` (later votes never change it)."""
    ep = rec.pending
    if ep is None or ep.epoch != epoch or voter not in rec.voters or voter in ep.votes:
        return rec
    return _replace_last(rec, ep.model_copy(update={"votes": {**ep.votes, voter: yes}}))


def report(rec: EpochRecord, voter: str, max_boundary: int, need: int | None = None) -> EpochRecord:
    """Remember the highest boundary the voter's processes reached (for choosing the next K)
    and the oldest epoch they use or need (`need`, for reusing slots; None: not reported)."""
    if voter not in rec.voters:
        return rec
    update: dict[str, object] = {}
    if rec.reported.get(voter, -1) < max_boundary:
        update["reported"] = {**rec.reported, voter: max_boundary}
    if need is not None and rec.needs.get(voter) != need:
        update["needs"] = {**rec.needs, voter: need}
    return rec.model_copy(update=update) if update else rec


def resolve(rec: EpochRecord) -> EpochRecord:
    """COMMITTED if every voter voted yes, ABORTED if anyone voted no, else unchanged."""
    ep = rec.pending
    if ep is None:
        return rec
    if any(v is False for v in ep.votes.values()):
        no = sorted(k for k, v in ep.votes.items() if not v)
        return _replace_last(
            rec,
            ep.model_copy(update={"status": EpochStatus.ABORTED, "reason": f"voted no: {no}"}),
        )
    if all(ep.votes.get(v) is True for v in rec.voters):
        done = _replace_last(rec, ep.model_copy(update={"status": EpochStatus.COMMITTED}))
        # the epoch whose slot it took is retired: the record keeps what the slots hold
        kept = tuple(e for e in done.epochs if e.epoch > ep.epoch - KEPT_EPOCHS)
        return done.model_copy(update={"epochs": kept})
    return rec


def abort(rec: EpochRecord, epoch: int, reason: str) -> EpochRecord:
    """Abort the pending `epoch` (anyone may; the CAS decides who wins)."""
    ep = rec.pending
    if ep is None or ep.epoch != epoch:
        return rec
    return _replace_last(
        rec, ep.model_copy(update={"status": EpochStatus.ABORTED, "reason": reason})
    )


def join(rec: EpochRecord, voter: str) -> EpochRecord:
    """Add `voter` (a sidecar that was not there when the record was created).

    Only while no epoch is pending: a pending epoch's votes are counted over the
    voters it was proposed to. A late sidecar first aborts the pending epoch
    (`abort`, always safe), then joins; every later epoch needs its vote too.
    """
    if voter in rec.voters or rec.pending is not None:
        return rec
    return rec.model_copy(update={"voters": (*rec.voters, voter)})

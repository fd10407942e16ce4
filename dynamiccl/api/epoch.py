"""The durable epoch record of the plugin's agreement protocol (docs/plugin.md).

One record per job, changed only by compare-and-swap.  Epoch ``e`` says "table
``table_version`` (digest ``table_digest``) takes effect at per-communicator call
index ``boundary``".  The transitions are pure functions here; the coordinator
(``dynamiccl.agent.coordinator``) and the sidecars (``dynamiccl.agent.participant``)
apply them through a CAS store, which makes every outcome unique.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

MAX_EPOCH: Final = 63  # epoch entries 1..63 in the shared-memory control region


class EpochStatus(StrEnum):
    """PENDING until every voter said yes (COMMITTED) or anyone aborted it (ABORTED)."""

    PENDING = "pending"
    COMMITTED = "committed"
    ABORTED = "aborted"


class Epoch(BaseModel):
    """One proposal and its outcome."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epoch: int = Field(ge=1, le=MAX_EPOCH)
    boundary: int = Field(ge=1)
    table_version: int = Field(ge=1)
    table_digest: int = Field(ge=0)
    status: EpochStatus = EpochStatus.PENDING
    votes: dict[str, bool] = Field(default_factory=dict)
    reason: str = ""


class EpochRecord(BaseModel):
    """The whole history of a job's epochs plus the voters' latest boundary reports."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval: int = Field(ge=64, le=1 << 24)
    voters: tuple[str, ...] = Field(min_length=1)
    epochs: tuple[Epoch, ...] = ()
    reported: dict[str, int] = Field(default_factory=dict)

    @property
    def pending(self) -> Epoch | None:
        """The open proposal, if any (at most one, always the last)."""
        if self.epochs and self.epochs[-1].status == EpochStatus.PENDING:
            return self.epochs[-1]
        return None


class ProposalError(ValueError):
    """A proposal is not possible now (one is pending, or the history is full)."""


def _replace_last(rec: EpochRecord, ep: Epoch) -> EpochRecord:
    return rec.model_copy(update={"epochs": (*rec.epochs[:-1], ep)})


def propose(rec: EpochRecord, table_version: int, table_digest: int, lead: int = 4) -> EpochRecord:
    """Open epoch len+1 at the first multiple of L at least `lead` intervals past every report."""
    if rec.pending is not None:
        raise ProposalError(f"epoch {rec.pending.epoch} is still pending")
    if len(rec.epochs) >= MAX_EPOCH:
        raise ProposalError(f"history full ({MAX_EPOCH} epochs); the job keeps its last table")
    step = rec.interval
    ahead = max(rec.reported.values(), default=0) + lead * step
    boundary = max(ahead, rec.epochs[-1].boundary + step if rec.epochs else step)
    boundary = -(-boundary // step) * step
    ep = Epoch(
        epoch=len(rec.epochs) + 1,
        boundary=boundary,
        table_version=table_version,
        table_digest=table_digest,
    )
    return rec.model_copy(update={"epochs": (*rec.epochs, ep)})


def vote(rec: EpochRecord, voter: str, epoch: int, yes: bool) -> EpochRecord:
    """Record `voter`'s first vote on the pending `epoch` (later votes never change it)."""
    ep = rec.pending
    if ep is None or ep.epoch != epoch or voter not in rec.voters or voter in ep.votes:
        return rec
    return _replace_last(rec, ep.model_copy(update={"votes": {**ep.votes, voter: yes}}))


def report(rec: EpochRecord, voter: str, max_boundary: int) -> EpochRecord:
    """Remember the highest boundary the voter's processes reached (for choosing the next K)."""
    if rec.reported.get(voter, -1) >= max_boundary or voter not in rec.voters:
        return rec
    return rec.model_copy(update={"reported": {**rec.reported, voter: max_boundary}})


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
        return _replace_last(rec, ep.model_copy(update={"status": EpochStatus.COMMITTED}))
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

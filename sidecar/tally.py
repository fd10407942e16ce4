"""Fold the pods' ballots into the epoch record (the proposer does, before every write).

The transitions are those of `dynamiccl.api.epoch`, applied in the order the single-record
protocol applied them when each pod wrote the record itself: a pod not yet among the
voters joins (aborting a pending epoch first: its votes were counted over the voters it
was proposed to), every pod's report, then the pending epoch's votes and outcome. The
record keeps no yes votes: a pending epoch's votes live in the ballots until its outcome
is decided, a committed epoch had only yes votes, an aborted one keeps who said no.
"""

from __future__ import annotations

from collections.abc import Mapping

from dynamiccl.api.epoch import EpochRecord, EpochStatus, abort, join, report, resolve, vote
from dynamiccl.sidecar.ballots import Ballot


def joined(rec: EpochRecord, voter: str) -> EpochRecord:
    """`rec` with `voter` among its voters (a pending epoch aborted first)."""
    if voter in rec.voters:
        return rec
    if rec.pending is not None:
        rec = abort(rec, rec.pending.epoch, f"{voter} joins")
    return join(rec, voter)


def fold(rec: EpochRecord, ballots: Mapping[str, Ballot]) -> EpochRecord:
    """The record the ballots make of `rec`: joins, reports, the pending epoch's outcome
    (unchanged while its votes do not decide it)."""
    for voter in sorted(set(ballots) - set(rec.voters)):
        rec = joined(rec, voter)
    for voter in sorted(ballots):
        b = ballots[voter]
        rec = report(rec, voter, b.reported, b.needs)
    ep = rec.pending
    if ep is None:
        return rec
    counted = rec
    for voter in sorted(ballots):
        v = ballots[voter].vote
        if v is not None and v.on(ep):
            counted = vote(counted, voter, ep.epoch, v.yes)
    decided = resolve(counted)
    if decided.pending is not None:
        return rec  # undecided: the votes stay in the ballots
    return _compact(decided, ballots)


def _compact(rec: EpochRecord, ballots: Mapping[str, Ballot]) -> EpochRecord:
    """The decided last epoch without its yes votes (and with the no voters' reasons)."""
    last = rec.epochs[-1]
    no = {k: v for k, v in last.votes.items() if not v}
    update: dict[str, object] = {"votes": no}
    if last.status == EpochStatus.ABORTED and no:
        why = [f"{k}: {_reason(ballots.get(k))}" for k in sorted(no)[:8]]
        more = f" (+{len(no) - 8} more)" if len(no) > 8 else ""
        update["reason"] = f"voted no: {'; '.join(why)}{more}"
    return rec.model_copy(update={"epochs": (*rec.epochs[:-1], last.model_copy(update=update))})


def _reason(b: Ballot | None) -> str:
    return (b.vote.reason if b is not None and b.vote is not None else "") or "no reason"

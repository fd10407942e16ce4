"""Pure transitions of the epoch record: one pending epoch, monotone boundaries, unique outcome."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dynamiccl.api.epoch import (
    KEPT_EPOCHS,
    EpochRecord,
    EpochStatus,
    ProposalError,
    abort,
    join,
    propose,
    report,
    resolve,
    vote,
)

VOTERS = ("a", "b")


def _rec() -> EpochRecord:
    return EpochRecord(interval=256, voters=VOTERS)


def test_boundary_is_a_multiple_of_l_ahead_of_every_report() -> None:
    rec = report(report(_rec(), "a", 1000), "b", 5000)
    rec = propose(rec, 1, 11, lead=2)
    ep = rec.epochs[-1]
    assert ep.boundary % 256 == 0
    assert ep.boundary >= 5000 + 2 * 256
    assert ep.status == EpochStatus.PENDING
    rec = resolve(vote(vote(rec, "a", 1, True), "b", 1, True))
    rec = propose(rec, 2, 22, lead=0)
    assert rec.epochs[-1].boundary > ep.boundary


def _commit(rec: EpochRecord) -> EpochRecord:
    ep = rec.epochs[-1]
    return resolve(vote(vote(rec, "a", ep.epoch, True), "b", ep.epoch, True))


def test_only_one_pending_and_an_aborted_number_is_proposed_again() -> None:
    rec = propose(_rec(), 1, 0)
    with pytest.raises(ProposalError, match="pending"):
        propose(rec, 2, 0)
    for i in range(100):  # aborts never use up epochs
        rec = propose(abort(rec, 1, "x"), i + 2, 0)
    assert [e.epoch for e in rec.epochs] == [1]
    assert rec.epochs[0].attempt == 101
    assert rec.epochs[0].table_version == 101


def test_a_job_never_runs_out_of_epochs_once_old_ones_are_no_longer_needed() -> None:
    """Epoch n + 63 takes epoch n's slot: proposable only once every voter reported that its
    processes use or need no epoch up to n; committing it drops n from the record."""
    rec = _rec()
    for n in range(1, 1001):
        rec = report(report(rec, "a", 0, n), "b", 0, n)  # every process is on the latest epoch
        rec = _commit(propose(rec, n, n))
        assert rec.epochs[-1].epoch == n
        assert len(rec.epochs) == min(n, KEPT_EPOCHS)
    # a pod whose processes still use epoch 1000 - 62 blocks the epoch that takes its slot
    rec = report(rec, "b", 0, 1000 - KEPT_EPOCHS + 1)
    with pytest.raises(ProposalError, match="still needed"):
        propose(rec, 1001, 0)
    rec = report(rec, "b", 0, 1000 - KEPT_EPOCHS + 2)
    assert propose(rec, 1001, 0).epochs[-1].epoch == 1001


def test_unanimous_yes_commits_any_no_aborts() -> None:
    rec = propose(_rec(), 1, 0)
    half = resolve(vote(rec, "a", 1, True))
    assert half.pending is not None  # still waiting for b
    assert resolve(vote(half, "b", 1, True)).epochs[-1].status == EpochStatus.COMMITTED
    no = resolve(vote(rec, "b", 1, False))
    assert no.epochs[-1].status == EpochStatus.ABORTED
    assert "b" in no.epochs[-1].reason


def test_votes_are_final_and_strangers_ignored() -> None:
    rec = vote(propose(_rec(), 1, 0), "a", 1, True)
    assert vote(rec, "a", 1, False) == rec
    assert vote(rec, "mallory", 1, False) == rec
    assert vote(rec, "b", 7, False) == rec  # not the pending epoch


def test_abort_applies_only_to_the_pending_epoch() -> None:
    rec = resolve(vote(vote(propose(_rec(), 1, 0), "a", 1, True), "b", 1, True))
    assert abort(rec, 1, "late") == rec  # committed stays committed
    rec = propose(rec, 2, 0)
    assert abort(rec, 2, "late").epochs[-1].status == EpochStatus.ABORTED


def test_reports_only_grow_and_needs_follow() -> None:
    rec = report(_rec(), "a", 100)
    assert report(rec, "a", 50) == rec
    assert report(rec, "a", 150).reported["a"] == 150
    assert report(rec, "a", 50, 7).needs["a"] == 7
    assert report(report(rec, "a", 50, 7), "a", 50, 3).needs["a"] == 3
    assert report(rec, "mallory", 500, 1) == rec


@settings(max_examples=300)
@given(st.text(max_size=300))
def test_records_parse_or_fail_cleanly(text: str) -> None:
    with contextlib.suppress(ValidationError):
        EpochRecord.model_validate_json(text)


@settings(max_examples=100)
@given(st.lists(st.sampled_from(["propose", "yes", "no", "abort", "report"]), max_size=40))
def test_any_sequence_of_transitions_keeps_the_invariants(ops: list[str]) -> None:
    rec = _rec()
    for i, op in enumerate(ops):
        pending = rec.pending
        if op == "propose":
            try:
                rec = propose(rec, i + 1, i, lead=i % 3)
            except ProposalError:
                assert pending is not None or rec.epochs[-1].epoch >= KEPT_EPOCHS
        elif op in ("yes", "no") and pending:
            rec = resolve(vote(rec, VOTERS[i % 2], pending.epoch, op == "yes"))
        elif op == "abort" and pending:
            rec = abort(rec, pending.epoch, "x")
        elif op == "report":
            rec = report(rec, VOTERS[i % 2], 97 * i, i)
        bounds = [e.boundary for e in rec.epochs]
        assert bounds == sorted(set(bounds))
        assert all(b % rec.interval == 0 for b in bounds)
        assert sum(e.status == EpochStatus.PENDING for e in rec.epochs) <= 1
        assert all(e.status == EpochStatus.COMMITTED for e in rec.epochs[:-1])
        numbers = [e.epoch for e in rec.epochs]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) if numbers else True
        assert sum(e.status == EpochStatus.COMMITTED for e in rec.epochs) <= KEPT_EPOCHS
        for e in rec.epochs:
            if e.status == EpochStatus.COMMITTED:
                assert all(e.votes.get(v) for v in VOTERS)


def test_join_only_without_a_pending_epoch_and_then_its_vote_counts() -> None:
    rec = propose(_rec(), 1, 11)
    assert join(rec, "c") == rec  # pending: the voter set is frozen
    rec = resolve(vote(vote(rec, "a", 1, True), "b", 1, True))
    assert rec.epochs[-1].status == EpochStatus.COMMITTED
    rec = join(rec, "c")
    assert rec.voters == ("a", "b", "c")
    assert join(rec, "c") == rec
    rec = resolve(vote(vote(propose(rec, 2, 22), "a", 2, True), "b", 2, True))
    assert rec.pending is not None  # c has not voted yet
    assert resolve(vote(rec, "c", 2, True)).epochs[-1].status == EpochStatus.COMMITTED

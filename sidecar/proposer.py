"""The coordinator side of the epoch protocol: publish tables, propose epochs, close votes.

The coordinator (the sidecar holding the proposer lease) reads the pods' ballots
(`dynamiccl.sidecar.ballots`) and folds them into the CAS record (`dynamiccl.sidecar.tally`):
it writes the record only when an epoch is proposed or decided, or a pod joins. It holds
no state of its own: everything is in the record and the ballots, so killing it at any
moment loses nothing; the next lease holder closes a pending epoch it leaves behind
(committed if every voter said yes, otherwise aborted), and any pod whose processes wait
at the boundary too long aborts it (``dynamiccl.sidecar.participant``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from dynamiccl.api.epoch import EpochRecord, ProposalError, propose
from dynamiccl.api.table import DecisionTable
from dynamiccl.sidecar.ballots import Ballot, BallotBox, file_ballots
from dynamiccl.sidecar.cas import CASStore, load_record, update_record
from dynamiccl.sidecar.tally import fold


class TableStore(Protocol):
    """Decision tables by version (immutable once published)."""

    def put(self, table: DecisionTable) -> None:
        """Publish a table under its version."""
        ...

    def get(self, version: int) -> DecisionTable | None:
        """The table of `version`, or None if unknown."""
        ...


class DirTableStore:
    """One JSON file per table version in a directory (file backend, tests, demo)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def put(self, table: DecisionTable) -> None:
        path = self.root / f"{table.version}.json"
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(table.model_dump_json())
        os.replace(tmp, path)

    def get(self, version: int) -> DecisionTable | None:
        try:
            return DecisionTable.model_validate_json((self.root / f"{version}.json").read_text())
        except FileNotFoundError:
            return None


def init_record(store: CASStore, interval: int, voters: tuple[str, ...]) -> EpochRecord:
    """Create the job's record if absent; returns the record stored."""
    rec, version = load_record(store)
    if rec is not None:
        return rec
    new = EpochRecord(interval=interval, voters=voters)
    store.cas(version, new.model_dump_json())  # 0 if absent; the operator may pre-create it
    got, _ = load_record(store)
    assert got is not None
    return got


class Coordinator:
    """Proposes queued tables one epoch at a time and commits epochs whose votes are all yes."""

    def __init__(
        self, store: CASStore, tables: TableStore, lead: int = 4, ballots: BallotBox | None = None
    ) -> None:
        self.store = store
        self.tables = tables
        self.lead = lead
        self.ballots = ballots if ballots is not None else file_ballots(store)
        self._read: dict[str, Ballot] = {}  # the ballots as last read

    def publish(self, table: DecisionTable) -> int | None:
        """Store `table` and propose it; returns the epoch number or None if one is pending."""
        self.tables.put(table)
        proposed: list[int] = []

        def change(rec: EpochRecord) -> EpochRecord:
            proposed.clear()
            view = fold(rec, self._read)  # the pods' latest reports choose the boundary
            try:
                new = propose(view, table.version, table.digest, self.lead)
            except ProposalError:
                return rec
            proposed.append(new.epochs[-1].epoch)
            return stored(new)

        update_record(self.store, change)
        return proposed[0] if proposed else None

    def step(self, own: Mapping[str, Ballot] | None = None) -> EpochRecord | None:
        """Read the ballots (`own`: this pod's latest, fresher than the stored one) and write
        the record if they decide the pending epoch or bring a new voter; returns the record
        as the ballots make it (None if there is none)."""
        self._read = self.ballots.all() | dict(own or {})
        rec, _ = load_record(self.store)
        if rec is None:
            return None
        view = fold(rec, self._read)
        if (view.epochs, view.voters) == (rec.epochs, rec.voters):
            return view  # the reports are the ballots': nothing to write
        ballots = self._read
        written = update_record(self.store, lambda r: stored(fold(r, ballots)))
        return None if written is None else fold(written, ballots)


def stored(rec: EpochRecord) -> EpochRecord:
    """`rec` as written: without the pods' reports, which their ballots hold (every pod
    reads the record at every step: 2 000 pods' reports would triple its size)."""
    return rec.model_copy(update={"reported": {}, "needs": {}})

"""The coordinator side of the epoch protocol: publish tables, propose epochs, close votes.

The coordinator holds no state of its own: everything is in the CAS record, so
killing it at any moment loses nothing.  A pending epoch it leaves behind is
closed by the sidecars (``dynamiccl.agent.participant``): committed if every voter
already said yes, otherwise aborted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from dynamiccl.agent.cas import CASStore, load_record, update_record
from dynamiccl.api.epoch import EpochRecord, ProposalError, propose, resolve
from dynamiccl.api.table import DecisionTable


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

    def __init__(self, store: CASStore, tables: TableStore, lead: int = 4) -> None:
        self.store = store
        self.tables = tables
        self.lead = lead

    def publish(self, table: DecisionTable) -> int | None:
        """Store `table` and propose it; returns the epoch number or None if one is pending."""
        self.tables.put(table)
        proposed: list[int] = []

        def change(rec: EpochRecord) -> EpochRecord:
            proposed.clear()
            try:
                new = propose(rec, table.version, table.digest, self.lead)
            except ProposalError:
                return rec
            proposed.append(new.epochs[-1].epoch)
            return new

        update_record(self.store, change)
        return proposed[0] if proposed else None

    def step(self) -> EpochRecord | None:
        """Close the pending epoch if its votes decide it."""
        return update_record(self.store, resolve)

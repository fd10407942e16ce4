"""The pods' ballots: each pod's vote on the pending epoch, its progress and its needs.

Each pod writes only its own ballot, one key (its name) of one of the job's ballot
objects (`coordination.group_of`: at most `GROUP_SIZE` pods share one); the proposer
reads them all and folds them into the epoch record (`dynamiccl.sidecar.tally`). So the
record, which every pod reads, is written about twice per epoch (proposal, outcome)
instead of once per pod, and no pod's write conflicts with another's: a one-key merge
patch needs no resourceVersion.

A ballot is only ever replaced by its own pod. A vote names the attempt it is for
(epoch, boundary, table digest), so a vote for an aborted attempt never counts for the
next one. A malformed ballot, or one found in another pod's object, is ignored (its pod
counts as not having voted: the epoch cannot commit without it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dynamiccl.api.epoch import Epoch
from dynamiccl.api.sidecar_objects import group_of
from dynamiccl.sidecar.cas import CASStore, FileCAS

log = logging.getLogger("dynamiccl.sidecar.ballots")


class Vote(BaseModel):
    """A pod's vote on one attempt of one epoch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epoch: int = Field(ge=1)
    boundary: int = Field(ge=1)
    digest: int = Field(ge=0)
    yes: bool
    reason: str = Field(default="", max_length=256)

    def on(self, ep: Epoch) -> bool:
        """Whether this vote is for `ep` (this attempt of it)."""
        return (self.epoch, self.boundary, self.digest) == (ep.epoch, ep.boundary, ep.table_digest)


class Ballot(BaseModel):
    """What one pod says: the highest boundary its processes reached, the oldest epoch they
    use or need (None: not reported yet) and its vote on the pending epoch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reported: int = Field(default=0, ge=0)
    needs: int | None = Field(default=None, ge=0)
    vote: Vote | None = None


class KeyStore(Protocol):
    """One object of string keys; a put replaces one key and touches no other."""

    def put(self, key: str, value: str) -> None:
        """Write one key."""
        ...

    def items(self) -> dict[str, str]:
        """Every key (empty when the object does not exist yet)."""
        ...


class MemoryKeys:
    """A `KeyStore` in memory (tests, benchmarks)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def put(self, key: str, value: str) -> None:
        self.data[key] = value

    def items(self) -> dict[str, str]:
        return dict(self.data)


class DirKeys:
    """A `KeyStore` as a directory, one file per key (file backend: tests, the demo)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, key: str, value: str) -> None:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"not a ballot key: {key!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.tmp{os.getpid()}"
        tmp.write_text(value)
        os.replace(tmp, self.root / key)

    def items(self) -> dict[str, str]:
        if not self.root.is_dir():
            return {}
        out: dict[str, str] = {}
        for path in self.root.iterdir():
            if not path.name.startswith("."):
                try:
                    out[path.name] = path.read_text()
                except FileNotFoundError:
                    continue
        return out


class BallotBox:
    """The ballots of one job, over its ballot objects (one per group of pods)."""

    def __init__(self, groups: Sequence[KeyStore]) -> None:
        if not groups:
            raise ValueError("a ballot box needs at least one object")
        self.groups = tuple(groups)

    def _group(self, voter: str) -> KeyStore:
        return self.groups[group_of(voter, len(self.groups))]

    def cast(self, voter: str, ballot: Ballot) -> None:
        """Write `voter`'s ballot (only its own key of its own group's object)."""
        self._group(voter).put(voter, ballot.model_dump_json(exclude_defaults=True))

    def mine(self, voter: str) -> Ballot | None:
        """`voter`'s ballot as stored (a restarted sidecar keeps its vote)."""
        raw = self._group(voter).items().get(voter)
        return None if raw is None else _parse(voter, raw)

    def all(self) -> dict[str, Ballot]:
        """Every valid ballot, by pod, each read from its own group's object."""
        out: dict[str, Ballot] = {}
        n = len(self.groups)
        for g, store in enumerate(self.groups):
            for voter, raw in store.items().items():
                if group_of(voter, n) != g:
                    log.warning("ignored %s's ballot in ballot object %d (not its own)", voter, g)
                    continue
                ballot = _parse(voter, raw)
                if ballot is not None:
                    out[voter] = ballot
        return out


def _parse(voter: str, raw: str) -> Ballot | None:
    try:
        return Ballot.model_validate_json(raw)
    except ValidationError as exc:
        log.warning("ignored %s's malformed ballot: %s", voter, exc.errors()[0]["msg"])
        return None


def file_ballots(record: CASStore) -> BallotBox:
    """The ballots beside a file record (one directory: files do not contend)."""
    if not isinstance(record, FileCAS):
        raise TypeError(f"no default ballots for a {type(record).__name__}: pass a BallotBox")
    return BallotBox([DirKeys(record.path.with_name(record.path.name + ".ballots"))])

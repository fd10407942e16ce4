"""The compare-and-swap store the epoch protocol runs on, and its file backend.

The interface is deliberately tiny so that a Kubernetes backend (the TuningRun's
resourceVersion) can implement it: ``read() -> (value, version)`` and
``cas(expected_version, new_value) -> bool``.  Version 0 means "no record yet".
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from dynamiccl.api.epoch import EpochRecord


class CASStore(Protocol):
    """One durable value with a version that changes on every successful write."""

    def read(self) -> tuple[str | None, int]:
        """(value, version); (None, 0) if nothing was written yet."""
        ...

    def cas(self, expected_version: int, new_value: str) -> bool:
        """Write `new_value` iff the current version is `expected_version`."""
        ...


class FileCAS:
    """A CAS record in one file: fcntl lock for the check, write-to-temp + rename for the swap."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = path.with_name(path.name + ".lock")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read(self) -> tuple[str | None, int]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None, 0
        return str(doc["value"]), int(doc["version"])

    def cas(self, expected_version: int, new_value: str) -> bool:
        with self._locked():
            _, version = self.read()
            if version != expected_version:
                return False
            tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
            with tmp.open("w") as f:
                json.dump({"version": version + 1, "value": new_value}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            return True


def load_record(store: CASStore) -> tuple[EpochRecord | None, int]:
    """The parsed record and its version."""
    value, version = store.read()
    return (None if value is None else EpochRecord.model_validate_json(value)), version


def update_record(
    store: CASStore, change: Callable[[EpochRecord], EpochRecord], attempts: int = 50
) -> EpochRecord | None:
    """Apply `change` with a CAS retry loop; returns the record now stored (None if absent)."""
    for _ in range(attempts):
        rec, version = load_record(store)
        if rec is None:
            return None
        new = change(rec)
        if new == rec or store.cas(version, new.model_dump_json()):
            return new
    raise TimeoutError("CAS contention: no update after many attempts")


class MemoryCAS:
    """A `CASStore` in memory (tests, benchmarks); counts its writes and refusals."""

    def __init__(self) -> None:
        self.value: str | None = None
        self.version = 0
        self.writes = 0
        self.conflicts = 0

    def read(self) -> tuple[str | None, int]:
        return self.value, self.version

    def cas(self, expected_version: int, new_value: str) -> bool:
        if expected_version != self.version:
            self.conflicts += 1
            return False
        self.value, self.version = new_value, self.version + 1
        self.writes += 1
        return True

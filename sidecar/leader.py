"""A lease on a CAS record: which of a job's sidecars proposes tables.

Leadership is only about *liveness* (one proposer at a time, so proposals do
not keep aborting each other); safety comes from the epoch record's CAS. Two
sidecars that both believe they lead (clock skew, a paused process) can only
race to propose, and the record accepts one proposal at a time.

The record is JSON ``{"holder": ..., "until_unix_s": ...}``, renewed when half
of its duration has passed, taken over when expired. Works on any `CASStore`
(a file for tests and the demo, a ConfigMap on Kubernetes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from dynamiccl.sidecar.cas import CASStore


class Lease:
    """One candidate's view of the lease."""

    def __init__(
        self,
        store: CASStore,
        holder: str,
        duration_s: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.holder = holder
        self.duration_s = duration_s
        self.clock = clock
        self._until = 0.0

    @property
    def held(self) -> bool:
        """True while our last successful acquisition has not expired (no I/O)."""
        return self.clock() < self._until

    def current(self) -> tuple[str | None, float, int]:
        """(holder, until, version) as stored; (None, 0, version) if absent or unreadable."""
        value, version = self.store.read()
        if value is None:
            return None, 0.0, version
        try:
            doc = json.loads(value)
            return str(doc["holder"]), float(doc["until_unix_s"]), version
        except (ValueError, KeyError, TypeError):
            return None, 0.0, version

    def step(self) -> bool:
        """Acquire or renew if possible; True if we hold the lease now."""
        now = self.clock()
        if self._until - now > self.duration_s / 2:
            return True  # renewed recently enough
        holder, until, version = self.current()
        if holder not in (None, self.holder) and until > now:
            self._until = 0.0
            return False
        new_until = now + self.duration_s
        body = json.dumps({"holder": self.holder, "until_unix_s": new_until})
        if self.store.cas(version, body):
            self._until = new_until
            return True
        self._until = 0.0
        return False

    def release(self) -> None:
        """Give the lease up (a clean shutdown): expire it now if we hold it."""
        holder, _until, version = self.current()
        if holder == self.holder:
            self.store.cas(version, json.dumps({"holder": self.holder, "until_unix_s": 0.0}))
        self._until = 0.0

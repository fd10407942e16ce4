"""The sidecar's durable state: ring cursors, open aggregates, numbered batches, acknowledgements.

Lives in a directory of the pod's shared-memory emptyDir (it survives a
restart of the sidecar container, not of the pod — neither does the job's
shared memory). Every file is replaced atomically (write to a temporary file,
then rename), so a sidecar killed at any instruction leaves either the old or
the new version:

- ``state.json``: per ring slot the position up to which records are folded
  into the aggregates, the aggregates themselves, the NCCL-default baseline,
  and ``next_seq`` (the sequence number of the next batch);
- ``outbox/<seq>.json``: a cut batch, exactly the bytes that are (re)sent;
- ``sent.json``: acknowledged totals and the last acknowledged sequence numbers.

The order of writes makes the whole exactly-once (runner.py):

1. read records (ring not consumed) → fold → save ``state.json`` → consume the
   ring up to the saved cursor. Killed before the save: the records are read
   again. Killed after it: the restarted sidecar consumes up to the cursor.
2. cut: write ``outbox/<s>.json`` → save ``state.json`` with empty aggregates
   and ``next_seq = s + 1``. Killed in between: `load` finds a batch numbered
   ``>= next_seq`` and drops the aggregates it already contains.
3. send: a batch is resent with the same idempotency key until the endpoint
   answers; ``sent.json`` is updated before the batch file is removed, and a
   sequence acknowledged twice (killed between the two) is counted once.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

STATE: Final = "state.json"
SENT: Final = "sent.json"
OUTBOX: Final = "outbox"
REJECTED: Final = "rejected"
STATE_VERSION: Final = 1
REMEMBER_ACKS: Final = 256


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (temporary file + rename in the same directory)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
    os.replace(tmp, path)


@dataclass
class SpoolState:
    """What `state.json` holds."""

    pod_uid: str
    next_seq: int = 1
    cursors: dict[int, int] = field(default_factory=dict)
    aggregator: dict[str, Any] = field(default_factory=dict)
    baseline: list[Any] = field(default_factory=list)
    recovered_cut: bool = False  # set by `load` when step 2 was interrupted

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": STATE_VERSION,
                "pod_uid": self.pod_uid,
                "next_seq": self.next_seq,
                "cursors": {str(k): v for k, v in sorted(self.cursors.items())},
                "aggregator": self.aggregator,
                "baseline": self.baseline,
            },
            separators=(",", ":"),
        ).encode()


@dataclass
class SentTotals:
    """Acknowledged batches and the collective calls they carried."""

    batches: int = 0
    calls: int = 0
    records: int = 0
    recent: list[int] = field(default_factory=list)


class Spool:
    """The directory; one writer of `state.json` (the drain loop), one of `sent.json` (sender)."""

    def __init__(self, root: Path, pod_uid: str) -> None:
        self.root = root
        self.pod_uid = pod_uid
        self.outbox_dir = root / OUTBOX
        self.rejected_dir = root / REJECTED
        for d in (root, self.outbox_dir, self.rejected_dir):
            d.mkdir(parents=True, exist_ok=True)

    # --- state.json -----------------------------------------------------------------
    def load(self) -> SpoolState:
        """The saved state, completed after an interrupted cut; fresh if none (or another pod's)."""
        try:
            doc = json.loads((self.root / STATE).read_bytes())
        except (FileNotFoundError, ValueError):
            doc = None
        if not isinstance(doc, dict) or doc.get("pod_uid") != self.pod_uid:
            st = SpoolState(self.pod_uid)
        else:
            st = SpoolState(
                pod_uid=self.pod_uid,
                next_seq=int(doc.get("next_seq", 1)),
                cursors={int(k): int(v) for k, v in (doc.get("cursors") or {}).items()},
                aggregator=doc.get("aggregator") or {},
                baseline=doc.get("baseline") or [],
            )
        cut = [s for s in self.outbox() if s >= st.next_seq]
        acked = self.sent().recent
        done = [s for s in acked if s >= st.next_seq]
        if cut or done:  # step 2 of a cut finished its batch but not its state
            st.next_seq = max(cut + done) + 1
            st.aggregator = {}
            st.recovered_cut = True
        return st

    def save(self, st: SpoolState) -> None:
        write_atomic(self.root / STATE, st.to_json())

    # --- outbox -------------------------------------------------------------------------
    def _batch_path(self, seq: int) -> Path:
        return self.outbox_dir / f"{seq:016d}.json"

    def put_batch(self, seq: int, body: bytes) -> None:
        write_atomic(self._batch_path(seq), body)

    def outbox(self) -> list[int]:
        """Sequence numbers waiting to be sent, oldest first."""
        out = []
        for p in self.outbox_dir.glob("*.json"):
            with contextlib.suppress(ValueError):
                out.append(int(p.stem))
        return sorted(out)

    def read_batch(self, seq: int) -> bytes | None:
        try:
            return self._batch_path(seq).read_bytes()
        except FileNotFoundError:
            return None

    def reject(self, seq: int, reason: str) -> None:
        """Park a batch the endpoint refuses for good (kept for inspection, never resent)."""
        src = self._batch_path(seq)
        with contextlib.suppress(FileNotFoundError):
            os.replace(src, self.rejected_dir / src.name)
            write_atomic(self.rejected_dir / f"{seq:016d}.reason", reason.encode())

    # --- sent.json ---------------------------------------------------------------------
    def sent(self) -> SentTotals:
        try:
            doc = json.loads((self.root / SENT).read_bytes())
            if not isinstance(doc, dict) or doc.get("pod_uid") != self.pod_uid:
                return SentTotals()
            return SentTotals(
                int(doc["batches"]),
                int(doc["calls"]),
                int(doc.get("records", 0)),
                [int(s) for s in doc.get("recent", [])],
            )
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
            return SentTotals()

    def ack(self, seq: int, calls: int, records: int) -> SentTotals:
        """Count an acknowledged batch once, then drop it from the outbox."""
        tot = self.sent()
        if seq not in tot.recent:
            tot.batches += 1
            tot.calls += calls
            tot.records += records
            tot.recent = [*tot.recent, seq][-REMEMBER_ACKS:]
            doc = {
                "pod_uid": self.pod_uid,
                "batches": tot.batches,
                "calls": tot.calls,
                "records": tot.records,
                "recent": tot.recent,
            }
            write_atomic(self.root / SENT, json.dumps(doc).encode())
        with contextlib.suppress(FileNotFoundError):
            self._batch_path(seq).unlink()
        return tot

"""Reading the plugin's profiler rings in bulk, with the read cursor under the caller's control.

``ShmFile.drain`` consumes records one by one as it parses them. The sidecar
needs the opposite order for restart safety: read records *without* consuming
them, make what it derived from them durable, and only then move the ring's
``tail`` (``consume``), so a sidecar killed in between re-reads them instead of
losing them. Reading is vectorised (numpy over the mapped ring) because a pod
can complete 10^4 collectives per second.

Ordering: a writer stores a record's body, then its ``seq`` word with release.
We load the ``seq`` words, then one sequentially consistent atomic load (a full
fence on every architecture), then copy the bodies of the records whose
``seq`` equals position + 1: their bodies are complete. Records keep their
slot until ``tail`` passes them, so nothing is overwritten while we copy.

A record whose writer died between claiming its position and publishing it
would stop the ring for good; a position that stays unpublished for
``stuck_after_s`` while later ones exist is skipped and counted.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

import atomics  # type: ignore[import-untyped]
import numpy as np

from dynamiccl.sidecar.shm import (
    FILE_SIZE,
    MAX_PROCS,
    PROC_HDR_SIZE,
    PROC_SLOT_SIZE,
    PROCS_OFF,
    RING_CAP,
    ShmError,
    parse_header,
)

RECORD_DTYPE: Final = np.dtype(
    [
        ("seq", "<u8"),
        ("comm_id", "<u8"),
        ("nbytes", "<u8"),
        ("start_ns", "<u8"),
        ("stop_ns", "<u8"),
        ("exec_ns", "<u8"),
        ("coll_seq", "<u8"),
        ("coll", "u1"),
        ("algo", "u1"),
        ("proto", "u1"),
        ("nchannels", "u1"),
        ("n_kernel_ch", "<u4"),
        ("user_tag", "<u8"),
        ("phase_ns", "<u8", (3,)),
        ("n_phases", "<u4"),
        ("flags", "u1"),
        ("pad", "V27"),
    ]
)
_HEAD: Final = 64
_TAIL: Final = 128
_DROPPED: Final = 136


class Rec(NamedTuple):
    """One completed collective (the fields the sidecar uses)."""

    comm_id: int
    nbytes: int
    exec_ns: int
    coll_seq: int
    coll: int
    algo: int
    proto: int
    nchannels: int
    start_ns: int  # GPU start, the earliest over channels (sidecar/steps.py times steps)
    user_tag: int = 0  # profiler v7: the application's tag of the call (0 = untagged)


class Columns(NamedTuple):
    """A block of records as one list per field, in ring order (`Rec`'s fields): the sidecar's
    drain loop walks these lists, with no Python object per record."""

    comm_id: list[int]
    nbytes: list[int]
    exec_ns: list[int]
    coll_seq: list[int]
    coll: list[int]
    algo: list[int]
    proto: list[int]
    nchannels: list[int]
    start_ns: list[int]
    user_tag: list[int]


_EMPTY: Final = Columns([], [], [], [], [], [], [], [], [], [])


@dataclass
class Batch:
    """Records read from one slot: positions [start, end) minus `skipped` unpublished ones."""

    slot: int
    start: int
    end: int
    cols: Columns = _EMPTY
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.cols.comm_id)

    @property
    def records(self) -> list[Rec]:
        """One `Rec` per record (for readers that want objects; the drain loop uses `cols`)."""
        return [Rec(*r) for r in zip(*self.cols, strict=True)]


class _Word:
    """An open atomic view of one 8-byte word, closed by `release` or when dropped."""

    __slots__ = ("ctx", "view")

    def __init__(self, buf: memoryview) -> None:
        self.ctx = atomics.atomicview(buffer=buf, atype=atomics.UINT)
        self.view = self.ctx.__enter__()

    def release(self) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(None, None, None)
            self.ctx = None

    def __del__(self) -> None:
        self.release()


class RingReader:
    """A second mapping of the shared-memory file, used only for the rings."""

    def __init__(
        self,
        path: Path,
        *,
        stuck_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise ShmError(f"{path}: {exc.strerror}") from exc
        try:
            if os.fstat(fd).st_size < FILE_SIZE:
                raise ShmError(f"{path}: smaller than {FILE_SIZE} bytes")
            self._mm = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._buf = memoryview(self._mm)
        parse_header(bytes(self._buf[:88]))
        self._rings = [
            np.frombuffer(
                self._mm, dtype=RECORD_DTYPE, count=RING_CAP, offset=self._off(i) + PROC_HDR_SIZE
            )
            for i in range(MAX_PROCS)
        ]
        # plain (non-atomic, aligned) views of every slot's owner / head / dropped words: a cheap
        # scan for slots with news; `read` then loads the head it trusts with seq_cst
        self._owners = self._column(0)
        self._heads = self._column(_HEAD)
        self._drops = self._column(_DROPPED)
        self.stuck_after_s = stuck_after_s
        self._clock = clock
        self._stuck: dict[tuple[int, int], float] = {}
        self._views: dict[int, _Word] = {}  # offset -> its atomic view (`_word`)

    def _column(self, field_off: int) -> np.ndarray:
        return np.ndarray(
            (MAX_PROCS,),
            dtype="<u8",
            buffer=self._mm,
            offset=PROCS_OFF + field_off,
            strides=(PROC_SLOT_SIZE,),
        )

    def scan(self) -> tuple[list[int], list[int], list[int]]:
        """(slots ever used, their heads, their dropped counts), from plain loads: hints only."""
        owners, heads, drops = self._owners.tolist(), self._heads.tolist(), self._drops.tolist()
        used = [i for i in range(MAX_PROCS) if owners[i] or heads[i]]
        return used, [heads[i] for i in used], [drops[i] for i in used]

    @staticmethod
    def _off(slot: int) -> int:
        if not 0 <= slot < MAX_PROCS:
            raise ValueError(f"slot {slot} out of range 0..{MAX_PROCS - 1}")
        return PROCS_OFF + slot * PROC_SLOT_SIZE

    def _word(self, off: int) -> Any:
        """The atomic view of the 8-byte word at `off`, made once (making one costs ~10x a
        load) and released by `close`."""
        got = self._views.get(off)
        if got is None:
            got = self._views[off] = _Word(self._buf[off : off + 8])
        return got.view

    def _load(self, off: int) -> int:
        return int(self._word(off).load())

    def _store(self, off: int, value: int) -> None:
        self._word(off).store(value)

    def owner(self, slot: int) -> int:
        """The slot's owner pid (0: never used)."""
        return self._load(self._off(slot))

    def owner_after_read(self, slot: int) -> int:
        """The slot's owner pid, by a plain load: as good as `owner` right after `read`, whose
        sequentially consistent load of the head is a full fence before it."""
        return int(self._owners[slot])

    def used_slots(self) -> list[int]:
        """Slots that ever had an owner (their rings may hold records even if it exited)."""
        return [i for i in range(MAX_PROCS) if self.owner(i) or self.head(i)]

    def head(self, slot: int) -> int:
        """Next position writers will claim."""
        return self._load(self._off(slot) + _HEAD)

    def tail(self, slot: int) -> int:
        """Next position to consume (the durable cursor the plugin sees)."""
        return self._load(self._off(slot) + _TAIL)

    def dropped(self, slot: int) -> int:
        """Records the writers dropped because the ring was full."""
        return self._load(self._off(slot) + _DROPPED)

    def consume(self, slot: int, position: int) -> None:
        """Free every position below `position` for the writers (never moves backwards)."""
        if position > self.tail(slot):
            self._store(self._off(slot) + _TAIL, position)

    def read(self, slot: int, start: int, limit: int = RING_CAP) -> Batch:
        """Published records from position `start` on (at most `limit`), without consuming them."""
        head = self.head(slot)
        n = min(head - start, limit, RING_CAP)
        out = Batch(slot, start, start)
        if n <= 0:
            return out
        ring = self._rings[slot]
        pos = np.arange(start, start + n, dtype=np.uint64)
        idx = (pos % RING_CAP).astype(np.intp)
        ok = ring["seq"][idx] == pos + 1
        self.head(slot)  # seq_cst load: orders the seq loads above before the body loads below
        good = int(n if ok.all() else np.argmin(ok))
        if good:
            body = ring[idx[:good]]  # a copy
            out.cols = Columns(*(body[f].tolist() for f in Columns._fields))
        out.end = start + good
        if good < n:
            out.skipped = self._maybe_skip(slot, out.end)
            out.end += out.skipped
        return out

    def _maybe_skip(self, slot: int, position: int) -> int:
        """1 if `position` has been unpublished for too long (its writer died), else 0."""
        key = (slot, position)
        now = self._clock()
        first = self._stuck.setdefault(key, now)
        for k in [k for k in self._stuck if k[0] == slot and k[1] < position]:
            del self._stuck[k]
        if now - first >= self.stuck_after_s:
            del self._stuck[key]
            return 1
        return 0

    def close(self) -> None:
        """Unmap."""
        self._rings.clear()
        del self._owners, self._heads, self._drops
        for word in self._views.values():
            word.release()
        self._views.clear()
        self._buf.release()
        self._mm.close()

"""Python codec of the plugin's shared-memory file (layout v4, ``plugin/include/dyn_shm.h``).

The sidecar creates the file, writes decision tables (epoch n in slot ``slot_of(n)``,
reused once n is retired), mirrors the epoch record into the control region and drains the
per-process profiler rings.  Words the plugin reads or writes concurrently are
accessed with sequentially consistent atomics (the ``atomics`` package), which
the agreement protocol's Dekker-style handshake relies on (docs/plugin.md).

The layout itself (sizes, offsets, the header and its checks, entry states, the
record format) is sidecar/shm_layout.py; its names are this module's too.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import atomics  # type: ignore[import-untyped]

from dynamiccl.sidecar import shm_layout as layout
from dynamiccl.sidecar.shm_layout import *  # noqa: F403 -- the layout's names are shm's too
from dynamiccl.sidecar.shm_table import (
    TABLE_BYTES,
    TABLE_READY,
    TABLE_WRITING,
)

__all__ = [
    "F_OFD_GETLK",
    "SHM_MODE",
    "ShmFile",
    "TableSlotError",
    "create",
]
__all__ += layout.__all__  # shm_layout.py's names: importers use `shm.<name>` for both

# Mode of the file, whatever the creator's umask: the sidecar (uid 65532) creates
# it and the plugin opens it O_RDWR inside the training container, which runs as
# any uid (another non-root uid, OpenShift's random uids, root without
# CAP_DAC_OVERRIDE). Read-write for everyone is safe here because of where the
# file lives: the pod's own emptyDir (medium Memory), mounted only into the
# sidecar and the training containers of that pod; no other pod, and no other
# user of the node, can reach it (the kubelet keeps pod volumes under a
# root-only directory). A group scheme (fsGroup) would need the webhook to
# rewrite the pod's securityContext, and random uids come with a group the
# sidecar cannot know in advance. docs/development.md, "The shared-memory file".
SHM_MODE: Final = 0o666

# struct flock (LP64 Linux: short type, short whence, off_t start, off_t len, pid_t pid) and the
# open-file-description lock commands (Linux >= 3.15, the same number on every architecture)
_FLOCK: Final = struct.Struct("@hhqqi4x")
F_OFD_GETLK: Final = getattr(fcntl, "F_OFD_GETLK", 36)


class TableSlotError(ValueError):
    """A table slot holds another epoch or different content (write_table writes a slot once;
    an epoch that takes a used slot goes through take_slot and put_image)."""


class _Word:
    """A sequentially consistent 64-bit word inside the mapping."""

    def __init__(self, buf: memoryview, off: int) -> None:
        self._view = buf[off : off + 8]

    def load(self) -> int:
        with atomics.atomicview(buffer=self._view, atype=atomics.UINT) as a:
            return int(a.load())

    def store(self, value: int) -> None:
        with atomics.atomicview(buffer=self._view, atype=atomics.UINT) as a:
            a.store(value)

    def cas(self, expected: int, desired: int) -> bool:
        with atomics.atomicview(buffer=self._view, atype=atomics.UINT) as a:
            return bool(a.cmpxchg_strong(expected=expected, desired=desired).success)


class _Half:
    """A sequentially consistent 32-bit word inside the mapping (the plugin's needs words)."""

    def __init__(self, buf: memoryview, off: int) -> None:
        self._view = buf[off : off + 4]

    def load(self) -> int:
        with atomics.atomicview(buffer=self._view, atype=atomics.UINT) as a:
            return int(a.load())


def create(
    path: Path, epoch_interval: int, prepare: Callable[[ShmFile], None] | None = None
) -> None:
    """Create (or keep, if already valid with the same L) the shared-memory file at `path`.

    A new file is built under a temporary name and renamed into place, so processes never
    map it half-made; `prepare` runs on it before the rename. A sidecar passes a step that
    mirrors the job's epoch history (tables + entries): a process must see every committed
    epoch from its first call on (docs/plugin.md, "joining").
    """
    layout.check_interval(epoch_interval)
    if path.exists() and path.stat().st_size >= layout.FILE_SIZE:
        with path.open("rb") as f:
            try:
                if layout.parse_header(f.read(88)) == epoch_interval:
                    # a restarted sidecar keeps the file: tables, entries and rings survive
                    # (and one made by an older sidecar gets the mode processes need)
                    _set_mode(f.fileno())
                    return
            except layout.ShmError:
                pass
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, SHM_MODE)
    with os.fdopen(fd, "wb") as f:
        _set_mode(fd)  # the umask (022 by default) took write access from group/other
        f.truncate(layout.FILE_SIZE)
        f.write(layout.header_bytes(epoch_interval))
    if prepare is not None:
        with ShmFile(tmp) as shm:
            prepare(shm)
    os.replace(tmp, path)


def _set_mode(fd: int) -> None:
    """Give the open file SHM_MODE; a file of another owner is left as it is."""
    with contextlib.suppress(PermissionError):
        os.fchmod(fd, SHM_MODE)


class ShmFile:
    """A mapping of the file with typed accessors (sidecar side)."""

    def __init__(self, path: Path) -> None:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise layout.ShmError(f"{path}: {exc.strerror}") from exc
        try:
            if os.fstat(fd).st_size < layout.FILE_SIZE:
                raise layout.ShmError(f"{path}: smaller than {layout.FILE_SIZE} bytes")
            self._mm = mmap.mmap(
                fd, layout.FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # kept: the processes' leases are tested through it (`lease_held`)
        self._buf = memoryview(self._mm)
        self.interval = layout.parse_header(bytes(self._buf[:88]))

    def close(self) -> None:
        """Unmap (views must be released first)."""
        self._buf.release()
        self._mm.close()
        os.close(self._fd)

    def __enter__(self) -> ShmFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- control region: epoch entries (one per slot) and sequence words ----
    def slot(self, epoch: int) -> tuple[int, int, int]:
        """(epoch held, status, boundary K) of `epoch`'s slot (epoch 0: never written)."""
        s = layout.slot_of(epoch)
        w = _Word(self._buf, layout.CTRL_OFF + 8 * s).load()
        return _Word(self._buf, layout.SEQS_OFF + 8 * s).load() & 0xFFFFFFFF, w & 0xFF, w >> 8

    def entry(self, epoch: int) -> tuple[int, int]:
        """(status, boundary K) of `epoch`; (EPOCH_NONE, 0) while its slot holds another."""
        held, status, k = self.slot(epoch)
        return (status, k) if held == epoch else (layout.EPOCH_NONE, 0)

    def set_entry(self, epoch: int, status: int, boundary: int) -> None:
        """Store `epoch`'s entry (seq_cst), its slot first taken for it if it holds no epoch."""
        if boundary % self.interval or boundary < self.interval:
            raise ValueError(f"boundary {boundary} is not a positive multiple of L={self.interval}")
        held, _st, _k = self.slot(epoch)
        if held not in (0, epoch):
            raise TableSlotError(f"slot of epoch {epoch} holds epoch {held} (use take_slot)")
        if held == 0:
            self._set_seq(epoch)
        _Word(self._buf, layout.CTRL_OFF + 8 * layout.slot_of(epoch)).store(
            (boundary << 8) | status
        )

    def _set_seq(self, epoch: int) -> None:
        """WRITING, then the slot's sequence word for `epoch` (next write generation)."""
        s = layout.slot_of(epoch)
        _Word(self._buf, layout.CTRL_OFF + 8 * s).store(layout.EPOCH_WRITING)
        seq = _Word(self._buf, layout.SEQS_OFF + 8 * s)
        seq.store((((seq.load() >> 32) + 1) & 0xFFFFFFFF) << 32 | epoch)

    def take_slot(self, epoch: int, status: int, boundary: int) -> None:
        """Give `epoch`'s slot to it whatever it holds: WRITING, sequence word, entry.

        The table bytes stay as they are (`put_image` writes them, only while the words hold
        no committed epoch): a process copies a slot's table only when the words say COMMITTED
        for the epoch it wants, so taking a slot for a pending epoch and giving it back after
        an abort leave the previous epoch's table intact.  Only for an epoch whose slot's
        previous epoch no process may use any more (the vote checks it, participant.py), or
        to put a kept epoch back after a reuse aborted."""
        if boundary % self.interval or boundary < self.interval:
            raise ValueError(f"boundary {boundary} is not a positive multiple of L={self.interval}")
        self._set_seq(epoch)
        _Word(self._buf, layout.CTRL_OFF + 8 * layout.slot_of(epoch)).store(
            (boundary << 8) | status
        )

    def put_image(self, epoch: int, image: bytes) -> None:
        """Write `epoch`'s table image into its slot, whose words must hold `epoch` and not say
        COMMITTED (nobody copies the bytes meanwhile); the entry may say COMMITTED after."""
        held, status, _k = self.slot(epoch)
        if held != epoch or status == layout.EPOCH_COMMITTED:
            raise TableSlotError(f"slot of epoch {epoch} holds epoch {held} (status {status})")
        self._write_image(epoch, image)

    def image_header(self, epoch: int) -> tuple[int, int, int, int]:
        """(state, epoch, table version, digest) of the table image in `epoch`'s slot."""
        off = self._slot_off(epoch)
        state = _Word(self._buf, off).load() & 0xFFFFFFFF
        held, version, digest = struct.unpack_from("<I4xQQ", self._buf, off + 16)
        return state, held, version, digest

    def set_heartbeat(self, pid: int, beat: int) -> None:
        """Informational sidecar pid and heartbeat counter (word 0 of the sequence words)."""
        struct.pack_into("<II", self._buf, layout.SEQS_OFF, pid & 0xFFFFFFFF, beat & 0xFFFFFFFF)

    def comms(self) -> dict[int, tuple[int, int]]:
        """Registered communicators: comm_id -> (nranks, nnodes) (entries READY, read seq_cst)."""
        out: dict[int, tuple[int, int]] = {}
        for i in range(layout.MAX_COMMS):
            off = layout.COMMS_OFF + i * layout.COMM_ENTRY_SIZE
            state = _Word(self._buf, off).load()
            if state == 0:
                break  # entries are claimed in order: the first free one ends the list
            if state == layout.COMM_READY:
                comm_id, shape = struct.unpack_from("<QQ", self._buf, off + 8)
                out.setdefault(comm_id, (shape & 0xFFFFFFFF, shape >> 32))
        return out

    # ---- table slots ----
    def _slot_off(self, epoch: int) -> int:
        return layout.TABLES_OFF + layout.slot_of(epoch) * layout.TABLE_SLOT_SIZE

    def read_table(self, epoch: int) -> bytes:
        """The raw TABLE_BYTES image of epoch's slot."""
        off = self._slot_off(epoch)
        return bytes(self._buf[off : off + TABLE_BYTES])

    def write_table(self, epoch: int, image: bytes) -> None:
        """Write `epoch`'s table once into its slot (free or already `epoch`'s). Equal content
        is a no-op; another table, or a slot of another epoch, raises TableSlotError."""
        if len(image) != TABLE_BYTES:
            raise ValueError(f"table image must be {TABLE_BYTES} bytes")
        held, _st, _k = self.slot(epoch)
        current = self.read_table(epoch)
        if held not in (0, epoch):
            raise TableSlotError(f"slot of epoch {epoch} holds epoch {held}")
        if current[:4] == struct.pack("<I", TABLE_READY):
            if current[4:] == image[4:]:
                return
            raise TableSlotError(f"table slot of epoch {epoch} already holds a different table")
        self._write_image(epoch, image)

    def _write_image(self, epoch: int, image: bytes) -> None:
        if len(image) != TABLE_BYTES:
            raise ValueError(f"table image must be {TABLE_BYTES} bytes")
        off = self._slot_off(epoch)
        state = _Word(self._buf, off)
        state.store(TABLE_WRITING)  # low 32 bits = state, high 32 bits = crc (rewritten below)
        self._buf[off + 8 : off + TABLE_BYTES] = image[8:]
        state.store(int.from_bytes(image[:8], "little"))  # crc + READY published together

    # ---- process slots and rings ----
    def _proc_off(self, i: int) -> int:
        return layout.PROCS_OFF + i * layout.PROC_SLOT_SIZE

    def lease_held(self, i: int) -> bool:
        """Whether some live process holds process slot i's lease (an OFD write lock on the
        slot's first byte, which the kernel drops when its holder exits, docs/plugin.md)."""
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, self._proc_off(i), 1, 0)
        got = fcntl.fcntl(self._fd, F_OFD_GETLK, probe)
        kind: int = _FLOCK.unpack(got)[0]
        return kind != fcntl.F_UNLCK

    def procs(self) -> list[layout.ProcSlot]:
        """Registered processes (owner pid != 0), each word read seq_cst. A slot whose owner
        took a lease is `alive` only while the lease is held; the lease is tested before the
        slot's words are read (a new owner locks before it publishes anything)."""
        out = []
        for i in range(layout.MAX_PROCS):
            off = self._proc_off(i)
            pid = _Word(self._buf, off).load()
            if pid:
                alive = not self._buf[off + 34] or self.lease_held(i)
                out.append(
                    layout.ProcSlot(
                        index=i,
                        pid=pid,
                        alive=alive,
                        max_boundary=_Word(self._buf, off + 8).load(),
                        generation=_Word(self._buf, off + 16).load(),
                        tuner_abi=self._buf[off + 32],
                        profiler_abi=self._buf[off + 33],
                        needs=tuple(
                            _Half(self._buf, off + 144 + 4 * k).load()
                            for k in range(layout.MAX_NEEDS)
                        ),
                        need_overflow=_Half(self._buf, off + 252).load(),
                    )
                )
        return out

    def ring_counters(self, i: int) -> tuple[int, int, int]:
        """(head, tail, dropped) of process slot i's ring."""
        off = self._proc_off(i)
        return (
            _Word(self._buf, off + 64).load(),
            _Word(self._buf, off + 128).load(),
            _Word(self._buf, off + 136).load(),
        )

    def drain(self, i: int, limit: int = layout.RING_CAP) -> list[layout.ProfRecord]:
        """Consume up to `limit` complete records from process slot i's ring, in order."""
        off = self._proc_off(i)
        tail_w = _Word(self._buf, off + 128)
        tail = tail_w.load()
        out: list[layout.ProfRecord] = []
        while len(out) < limit:
            roff = off + layout.PROC_HDR_SIZE + (tail % layout.RING_CAP) * layout.RECORD_SIZE
            if _Word(self._buf, roff).load() != tail + 1:
                break  # not yet written (or a writer died mid-record)
            f = layout.RECORD.unpack_from(self._buf, roff)
            out.append(
                layout.ProfRecord(
                    seq=f[0],
                    comm_id=f[1],
                    nbytes=f[2],
                    start_ns=f[3],
                    stop_ns=f[4],
                    exec_ns=f[5],
                    coll_seq=f[6],
                    coll=f[7],
                    algo=f[8],
                    proto=f[9],
                    nchannels=f[10],
                    n_kernel_ch=f[11],
                    user_tag=f[12],
                    phase_ns=(f[13], f[14], f[15]),
                    n_phases=f[16],
                    flags=f[17],
                )
            )
            tail += 1
            tail_w.store(tail)
        return out

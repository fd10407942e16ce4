"""The shared-memory file's layout v4 (``plugin/include/dyn_shm.h``): sizes, offsets, the
header and its checks, epoch entries' states, the record format (pure: no file).

sidecar/shm.py maps the file and reads and writes it with these; the plugin's C
side has the same numbers, and `parse_header` makes the same checks as the plugin
before either side uses a file.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from pydantic import BaseModel, ConfigDict

from dynamiccl.sidecar.shm_table import MAX_EPOCHS

__all__ = [
    "COMMS_OFF",
    "COMM_ENTRY_SIZE",
    "COMM_READY",
    "CTRL_OFF",
    "EPOCH_ABORTED",
    "EPOCH_COMMITTED",
    "EPOCH_NONE",
    "EPOCH_PENDING",
    "EPOCH_WRITING",
    "FILE_SIZE",
    "HEADER_SIZE",
    "LAYOUT_VERSION",
    "MAGIC",
    "MAX_COMMS",
    "MAX_INTERVAL",
    "MAX_NEEDS",
    "MAX_PROCS",
    "MIN_INTERVAL",
    "N_PHASES",
    "PROCS_OFF",
    "PROC_HDR_SIZE",
    "PROC_SLOT_SIZE",
    "RECORD",
    "RECORD_SIZE",
    "REC_SYMMETRIC",
    "REC_V7",
    "RING_CAP",
    "SEQS_OFF",
    "SLOTS",
    "TABLES_OFF",
    "TABLE_SLOT_SIZE",
    "ProcSlot",
    "ProfRecord",
    "ShmError",
    "check_interval",
    "header_bytes",
    "parse_header",
    "slot_of",
]

MAGIC: Final = 0x31304C4343594E44
LAYOUT_VERSION: Final = 4  # 4: table slots recycled (sequence words, needs); 3: 128-byte records
SLOTS: Final = MAX_EPOCHS - 1  # usable table slots (1..63): the epochs kept at once
MAX_NEEDS: Final = 27  # communicators per process that publish the epoch they need
MAX_PROCS: Final = 32
RING_CAP: Final = 1024
HEADER_SIZE: Final = 4096
CTRL_OFF: Final = 4096
TABLES_OFF: Final = 8192
TABLE_SLOT_SIZE: Final = 81920
PROCS_OFF: Final = TABLES_OFF + MAX_EPOCHS * TABLE_SLOT_SIZE
RECORD_SIZE: Final = 128
PROC_HDR_SIZE: Final = 256
PROC_SLOT_SIZE: Final = PROC_HDR_SIZE + RING_CAP * RECORD_SIZE
FILE_SIZE: Final = PROCS_OFF + MAX_PROCS * PROC_SLOT_SIZE
SEQS_OFF: Final = CTRL_OFF + 512  # the slots' sequence words: generation << 32 | epoch
COMMS_OFF: Final = CTRL_OFF + 1024  # communicator registry (written by the processes)
MAX_COMMS: Final = 128
COMM_ENTRY_SIZE: Final = 24
COMM_READY: Final = 2
MIN_INTERVAL: Final = 64
MAX_INTERVAL: Final = 1 << 24

EPOCH_NONE: Final = 0
EPOCH_PENDING: Final = 1
EPOCH_COMMITTED: Final = 2
EPOCH_ABORTED: Final = 3
EPOCH_WRITING: Final = 4  # the sidecar is rewriting the slot (the plugin waits)

_HDR: Final = struct.Struct("<QIIQQQQIIQIIII")  # bytes [0, 80) of the header
RECORD: Final = struct.Struct("<QQQQQQQBBBBIQQQQIB27x")
N_PHASES: Final = 3  # v7 kernel phases: initial sync, compute, final sync
REC_SYMMETRIC: Final = 0x1  # flags: a symmetric-memory kernel ran the collective
REC_V7: Final = 0x2  # flags: written by profiler ABI v7 (user_tag and phase_ns are meaningful)


class ShmError(ValueError):
    """The file is missing, too small, or does not carry this layout."""


class ProfRecord(BaseModel):
    """One collective as the profiler saw it (GPU times in ns from KernelCh events)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    comm_id: int
    nbytes: int
    start_ns: int
    stop_ns: int
    exec_ns: int
    coll_seq: int
    coll: int
    algo: int
    proto: int
    nchannels: int
    n_kernel_ch: int
    user_tag: int = 0  # the application's per-call tag (profiler v7; 0 = untagged)
    phase_ns: tuple[int, int, int] = (0, 0, 0)  # v7: longest channel time of each kernel phase
    n_phases: int = 0
    flags: int = 0  # REC_*


class ProcSlot(BaseModel):
    """A training process registered in the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    pid: int
    max_boundary: int
    generation: int
    tuner_abi: int = 0  # the tuner ABI NCCL loaded in this process (0: none yet)
    profiler_abi: int = 0  # the profiler ABI (0: none; NCCL < 2.27 loads no v4+)
    needs: tuple[int, ...] = ()  # per communicator: the oldest epoch it uses or needs
    need_overflow: int = 0  # communicators that could not publish theirs
    alive: bool = True  # False: the owner's lease is gone (it exited or was killed)


def slot_of(epoch: int) -> int:
    """The table slot of epoch `epoch` (1, 2, ...): epoch n + 63 reuses epoch n's."""
    if epoch < 1 or epoch >= 1 << 32:
        raise ValueError(f"epoch {epoch} out of range 1..2^32-1")
    return 1 + (epoch - 1) % SLOTS


def header_bytes(epoch_interval: int) -> bytes:
    """The 88-byte header for a file with boundary interval L = epoch_interval."""
    check_interval(epoch_interval)
    body = _HDR.pack(
        MAGIC,
        LAYOUT_VERSION,
        HEADER_SIZE,
        FILE_SIZE,
        epoch_interval,
        CTRL_OFF,
        TABLES_OFF,
        TABLE_SLOT_SIZE,
        MAX_EPOCHS,
        PROCS_OFF,
        PROC_SLOT_SIZE,
        MAX_PROCS,
        RING_CAP,
        RECORD_SIZE,
    )
    return body + struct.pack("<II", zlib.crc32(body), 1)


def check_interval(epoch_interval: int) -> None:
    """L must be a power of two in [MIN_INTERVAL, MAX_INTERVAL]."""
    if not MIN_INTERVAL <= epoch_interval <= MAX_INTERVAL or epoch_interval & (epoch_interval - 1):
        raise ShmError(f"epoch_interval {epoch_interval} is not a power of two in [64, 2^24]")


def parse_header(buf: bytes) -> int:
    """Validate a header (same checks as the plugin); returns the epoch interval L."""
    if len(buf) < 88:
        raise ShmError("header truncated")
    fields = _HDR.unpack_from(buf, 0)
    crc, ready = struct.unpack_from("<II", buf, 80)
    expected = (MAGIC, LAYOUT_VERSION, HEADER_SIZE, FILE_SIZE)
    if fields[:4] != expected or ready != 1 or crc != zlib.crc32(buf[:80]):
        raise ShmError(f"not a DynamICCL v{LAYOUT_VERSION} shared-memory header")
    if fields[5:] != (
        CTRL_OFF,
        TABLES_OFF,
        TABLE_SLOT_SIZE,
        MAX_EPOCHS,
        PROCS_OFF,
        PROC_SLOT_SIZE,
        MAX_PROCS,
        RING_CAP,
        RECORD_SIZE,
    ):
        raise ShmError("shared-memory layout constants differ from this build")
    interval = int(fields[4])
    check_interval(interval)
    return interval

"""The decision-table slot image of the shared-memory file (``plugin/include/dyn_shm.h``).

One slot per epoch holds a TABLE_BYTES image: a header (state, CRC, magic,
format, epoch, scales, version, digest, exploration seed) and one CELL_SIZE
cell per (scale, collective, size bucket) with the ranked choices and the
online tuner's candidates. `encode_table` writes an image; `validate_table`
repeats the plugin's checks and returns its negative reason codes.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from dynamiccl.api.table import (
    MAX_CANDIDATES,
    MAX_CHOICES,
    MAX_SCALES,
    N_BUCKETS,
    N_SCALE_CLASSES,
    NO_HALF_LIFE,
    Choice,
    DecisionTable,
)

N_FUNCS: Final = 5
MAX_EPOCHS: Final = 64  # table slots (slot 0 unused); epochs 1, 2, ... reuse them
NO_SCALE: Final = 0xFF
CELL_SIZE: Final = 48
TABLE_HDR_SIZE: Final = 64
TABLE_BYTES: Final = TABLE_HDR_SIZE + MAX_SCALES * N_FUNCS * N_BUCKETS * CELL_SIZE
TABLE_MAGIC: Final = 0x4C425444
TABLE_FORMAT: Final = 3  # 3: 128 scale classes (dynamiccl/api/table.py SCALE_ENCODING 2); 2: 32
TABLE_EMPTY: Final = 0
TABLE_WRITING: Final = 1
TABLE_READY: Final = 2

_TBL_HDR: Final = struct.Struct(f"<IIIIIIQQQII{MAX_SCALES}s")
_CELL: Final = struct.Struct("<BBH16s16s4HI")


def _choice_bytes(c: Choice) -> bytes:
    return bytes((c.algo.nccl_id, c.proto.nccl_id, c.nchannels, c.chunk_log2))


def encode_table(table: DecisionTable, epoch: int) -> bytes:
    """The TABLE_BYTES image of `table` as epoch `epoch`'s slot content (state READY, CRC set)."""
    if not 1 <= epoch < 1 << 32:
        raise ValueError(f"epoch {epoch} out of range 1..2^32-1")
    body = bytearray(TABLE_BYTES)
    scale_ids = bytes(list(table.scales) + [NO_SCALE] * (MAX_SCALES - len(table.scales)))
    hl = NO_HALF_LIFE if table.explore.half_life_log2 is None else table.explore.half_life_log2
    _TBL_HDR.pack_into(
        body,
        0,
        TABLE_READY,
        0,
        TABLE_MAGIC,
        TABLE_FORMAT,
        epoch,
        len(table.scales),
        table.version,
        table.digest,
        table.explore.seed,
        hl,
        0,
        scale_ids,
    )
    for cell in table.cells:
        s = table.scales.index(cell.scale)
        off = (
            TABLE_HDR_SIZE
            + ((s * N_FUNCS + cell.collective.nccl_id) * N_BUCKETS + cell.bucket) * CELL_SIZE
        )
        choices = b"".join(_choice_bytes(c) for c in cell.choices).ljust(4 * MAX_CHOICES, b"\0")
        cands = b"".join(_choice_bytes(c) for c in cell.candidates).ljust(4 * MAX_CANDIDATES, b"\0")
        weights = [c.weight for c in cell.candidates] + [0] * (
            MAX_CANDIDATES - len(cell.candidates)
        )
        _CELL.pack_into(
            body,
            off,
            len(cell.choices),
            len(cell.candidates),
            cell.eps_q16,
            choices,
            cands,
            *weights,
            0,
        )
    struct.pack_into("<I", body, 4, zlib.crc32(bytes(body[8:])))
    return bytes(body)


def validate_table(buf: bytes, epoch: int) -> int:
    """0 if `buf` is a well-formed image for `epoch`, else the plugin's negative reason."""
    if len(buf) < TABLE_BYTES:
        return -1
    (state, crc, magic, fmt, ep, n_scales, _v, _d, _s, hl, _f, scale_ids) = _TBL_HDR.unpack_from(
        buf, 0
    )
    checks = (
        (state == TABLE_READY, -1),
        (magic == TABLE_MAGIC and fmt == TABLE_FORMAT, -2),
        (ep == epoch, -3),
        (n_scales <= MAX_SCALES, -4),
        (hl <= 63 or hl == NO_HALF_LIFE, -5),
    )
    for ok, code in checks:
        if not ok:
            return code
    used = list(scale_ids[:n_scales])
    if any(i >= N_SCALE_CLASSES for i in used):
        return -7
    if len(set(used)) != len(used):
        return -8
    if any(i != NO_SCALE for i in scale_ids[n_scales:]):
        return -9
    for idx in range(MAX_SCALES * N_FUNCS * N_BUCKETS):
        n_ch, n_ca, _eps, ch, ca, *_rest = _CELL.unpack_from(buf, TABLE_HDR_SIZE + idx * CELL_SIZE)
        if n_ch > MAX_CHOICES or n_ca > MAX_CANDIDATES:
            return -10
        for raw, n, code in ((ch, n_ch, -11), (ca, n_ca, -12)):
            for k in range(n):
                a, p, _nc, chunk = raw[4 * k : 4 * k + 4]
                if a >= 7 or p >= 3 or chunk > 31:
                    return code
    return 0 if crc == zlib.crc32(buf[8:TABLE_BYTES]) else -6  # the checksum last, as in C

"""The shared-memory file's layout (sidecar/shm_layout.py): the C header's numbers, the header."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiccl.sidecar import shm_layout as layout
from dynamiccl.sidecar import shm_table


def test_layout_constants_match_the_c_header() -> None:
    header = (Path(__file__).resolve().parents[3] / "plugin/include/dyn_shm.h").read_text()
    for name, value in [
        ("DYN_MAX_EPOCHS", shm_table.MAX_EPOCHS),
        ("DYN_MAX_PROCS", layout.MAX_PROCS),
        ("DYN_RING_CAP", layout.RING_CAP),
        ("DYN_TABLE_SLOT_SIZE", layout.TABLE_SLOT_SIZE),
        ("DYN_N_BUCKETS", 41),
        ("DYN_MAX_SCALES", 8),
        ("DYN_RECORD_SIZE", f"{layout.RECORD_SIZE}u"),
        ("DYN_SHM_LAYOUT_VERSION", f"{layout.LAYOUT_VERSION}u"),
        ("DYN_N_PHASES", layout.N_PHASES),
        ("DYN_REC_SYMMETRIC", f"{layout.REC_SYMMETRIC:#x}u"),
        ("DYN_REC_V7", f"{layout.REC_V7:#x}u"),
    ]:
        assert f"#define {name} {value}" in header, name
    assert layout.FILE_SIZE == 9453568  # layout 3: 128-byte records
    assert shm_table.TABLE_BYTES == 78784


def test_header_errors() -> None:
    good = layout.header_bytes(64)
    assert layout.parse_header(good) == 64
    for pos in (0, 8, 24, 60, 82):
        bad = bytearray(good)
        bad[pos] ^= 1
        with pytest.raises(layout.ShmError):
            layout.parse_header(bytes(bad))
    with pytest.raises(layout.ShmError):
        layout.check_interval(100)


def test_epochs_take_turns_in_the_table_slots() -> None:
    assert [layout.slot_of(e) for e in (1, 2, layout.SLOTS, layout.SLOTS + 1)] == [1, 2, 63, 1]
    for bad in (0, 1 << 32):
        with pytest.raises(ValueError, match="out of range"):
            layout.slot_of(bad)


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_parse_header_accepts_only_valid_headers(data: bytes) -> None:
    try:
        interval = layout.parse_header(data)
    except layout.ShmError:
        return
    assert data[:88] == layout.header_bytes(interval)

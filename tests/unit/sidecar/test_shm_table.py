"""The decision-table slot image: round trip, the plugin's reason codes, garbage never raises."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable
from dynamiccl.sidecar import shm_table

TABLE = DecisionTable(
    version=4,
    scales=(3, 7),
    cells=(
        Cell(
            collective=Collective.ALLGATHER,
            bucket=12,
            scale=7,
            choices=(Choice(algo=Algo.RING, proto=Proto.LL, nchannels=2, chunk_bytes=1 << 12),),
        ),
    ),
)


def test_table_round_trip_and_validation() -> None:
    image = shm_table.encode_table(TABLE, 5)
    assert len(image) == shm_table.TABLE_BYTES
    assert shm_table.validate_table(image, 5) == 0
    assert shm_table.validate_table(image, 6) == -3
    bad = bytearray(image)
    bad[100] ^= 1
    assert shm_table.validate_table(bytes(bad), 5) == -6
    assert shm_table.validate_table(shm_table.encode_table(TABLE, 64), 64) == 0  # slots reused
    with pytest.raises(ValueError, match="epoch"):
        shm_table.encode_table(TABLE, 1 << 32)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=512), st.integers(0, shm_table.TABLE_BYTES - 1))
def test_validate_table_never_raises_on_garbage(patch: bytes, at: int) -> None:
    image = bytearray(shm_table.encode_table(TABLE, 2))
    image[at : at + len(patch)] = patch[: shm_table.TABLE_BYTES - at]
    struct.pack_into("<I", image, 4, zlib.crc32(bytes(image[8 : shm_table.TABLE_BYTES])))
    code = shm_table.validate_table(bytes(image[: shm_table.TABLE_BYTES]), 2)
    assert code <= 0

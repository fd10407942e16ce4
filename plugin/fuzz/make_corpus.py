"""Regenerate the seed corpus (committed under fuzz/corpus/): python plugin/fuzz/make_corpus.py"""

from __future__ import annotations

import struct
from pathlib import Path

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Candidate, Cell, Choice, DecisionTable, ExploreSchedule
from dynamiccl.sidecar.shm import header_bytes
from dynamiccl.sidecar.shm_table import encode_table

OUT = Path(__file__).with_name("corpus")


def main() -> None:
    entries = [0, (64 << 8) | 2, (128 << 8) | 1, (192 << 8) | 3, (256 << 8) | 2] + [0] * 59
    seqs = [0, 1, 2, 3, 4] + [0] * 59
    steps = struct.pack("<6H", 1, 1, 1, 1, 2, 3)
    shm_seed = header_bytes(64) + struct.pack("<64Q", *entries) + struct.pack("<64Q", *seqs) + steps
    (OUT / "fuzz_shm" / "seed-valid").write_bytes(shm_seed)
    # slots reused: epochs 64..66 in slots 1..3 (1..3 retired), 4 still in slot 4, one slot
    # being rewritten (WRITING) and one whose reuse is pending
    entries = [0, (320 << 8) | 2, (384 << 8) | 2, (448 << 8) | 1, (256 << 8) | 2, 4] + [0] * 58
    seqs = [0, 64 | 1 << 32, 65 | 1 << 32, 66 | 1 << 32, 4, 68 | 2 << 32] + [0] * 58
    (OUT / "fuzz_shm" / "seed-recycled").write_bytes(
        header_bytes(64)
        + struct.pack("<64Q", *entries)
        + struct.pack("<64Q", *seqs)
        + struct.pack("<6H", 1, 3, 1, 1, 1, 2)
    )
    # a reuse that aborted: epoch 64 still holds epoch 1's slot (ABORTED) until the sidecar
    # gives it back; epochs 2..63 committed in theirs
    entries = [0, (64 * 64 << 8) | 3] + [(64 * e << 8) | 2 for e in range(2, 64)]
    seqs = [0, 64 | 1 << 32, *range(2, 64)]
    (OUT / "fuzz_shm" / "seed-reuse-aborted").write_bytes(
        header_bytes(64)
        + struct.pack("<64Q", *entries)
        + struct.pack("<64Q", *seqs)
        + struct.pack("<6H", 1, 2, 8, 16, 32, 64)
    )
    (OUT / "fuzz_shm" / "seed-bad-entry").write_bytes(
        header_bytes(256) + struct.pack("<3Q", 0, (100 << 8) | 2, 7) + b"\x01\x00\x05\x00"
    )
    cost = [1.0, 2.0, 3.0, -1.0, 0.5, 9.0] + [-1.0] * 6 + [4.0, -1.0, 7.0] + [-1.0] * 6
    t = DecisionTable(
        version=5,
        scales=(7, 3),
        explore=ExploreSchedule(seed=9, half_life_log2=3),
        cells=(
            Cell(
                collective=Collective.ALLREDUCE,
                bucket=0,
                scale=7,
                explore=0.5,
                choices=(
                    Choice(algo=Algo.NVLS, proto=Proto.SIMPLE, nchannels=8),
                    Choice(algo=Algo.RING, proto=Proto.LL, chunk_bytes=1 << 16),
                ),
                candidates=(
                    Candidate(algo=Algo.TREE, proto=Proto.LL128, weight=5),
                    Candidate(algo=Algo.PAT, proto=Proto.SIMPLE),
                ),
            ),
            Cell(
                collective=Collective.BROADCAST,
                bucket=7,
                scale=3,
                choices=(Choice(algo=Algo.RING, proto=Proto.SIMPLE),),
            ),
        ),
    )
    image = encode_table(t, 2)
    cells = b""
    for idx in range(4 * 5 * 41):
        cell = image[64 + 48 * idx : 64 + 48 * (idx + 1)]
        if any(cell):
            cells += struct.pack("<H", idx) + cell
    for flag in (0, 1, 0x81):
        (OUT / "fuzz_table" / f"seed-{flag}").write_bytes(
            bytes([flag]) + struct.pack("<21f", *cost) + image[:64] + cells
        )
    # fuzz_profiler: byte 0 picks the ABI (even: v6, odd: v7), then 4-byte ops
    start, chans = bytes([0, 1, 2, 3, 1, 1, 0, 9, 1, 1, 1, 9]), bytes([2, 0, 7, 1, 2, 0, 9, 1])
    ops = start + chans + bytes([3, 1, 0, 0])
    prof = OUT / "fuzz_profiler"
    (prof / "seed-coll").write_bytes(bytes([0]) + ops)
    (prof / "seed-drain").write_bytes(bytes([0]) + ops + bytes([0, 2, 6, 0x8D, 3, 2, 0, 0]))
    (prof / "seed-v7-coll").write_bytes(bytes([1]) + ops)
    # v7: phases 0..2 of both channels (start, stop), one out of range, then the channels stop
    phases = bytes([4, 0, 0, 0, 5, 0, 0, 9, 4, 0, 1, 1, 5, 0, 1, 9, 4, 0, 0, 2, 4, 0, 1, 3])
    (prof / "seed-v7-phases").write_bytes(bytes([1]) + start + phases + chans + bytes([3, 1, 0, 0]))
    # v7: a symmetric collective with its kernel variant, then an isSymColl byte of 2 (not
    # NVIDIA's layout: refused before userTag is read)
    (prof / "seed-v7-layout").write_bytes(bytes([1, 0, 2, 0x10, 3, 0, 1, 0x20, 2]) + chans)


if __name__ == "__main__":
    main()

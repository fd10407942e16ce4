"""Deterministic exploration schedules: which candidate a call tries.

Every rank of a communicator must try the same configuration at the same call
(DESIGN.md §3.2), so the choice is a pure function of inputs every rank shares:
the job's exploration seed, the communicator id, the bucket, the per-bucket call
index, and the candidate weights of the agreed table version. Nothing here reads
timing, clocks or any rank-local state.

The hash is splitmix64 (Steele, Lea, Flood 2014) chained over the four inputs;
it needs only 64-bit adds, xors, shifts and multiplies, so the C plugin computes
the identical value. Weights are fixed point: non-negative integers summing to
`WEIGHT_ONE`; the candidate is the first whose cumulative weight exceeds the top
16 bits of the hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

MASK64: Final = (1 << 64) - 1
WEIGHT_BITS: Final = 16
WEIGHT_ONE: Final = 1 << WEIGHT_BITS
_GOLDEN: Final = 0x9E3779B97F4A7C15
_MUL1: Final = 0xBF58476D1CE4E5B9
_MUL2: Final = 0x94D049BB133111EB


def splitmix64(x: int) -> int:
    """One splitmix64 step: a bijective 64-bit mix."""
    z = (x + _GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & MASK64
    return z ^ (z >> 31)


def call_hash(seed: int, comm_id: int, bucket: int, call_index: int) -> int:
    """64-bit hash of (seed, communicator, bucket, call index); identical on every rank."""
    h = splitmix64(seed & MASK64)
    h = splitmix64(h ^ (comm_id & MASK64))
    h = splitmix64(h ^ (bucket & MASK64))
    return splitmix64(h ^ (call_index & MASK64))


def check_weights(weights: Sequence[int]) -> None:
    """ValueError unless `weights` is a valid fixed-point distribution."""
    if not weights:
        raise ValueError("weights: empty candidate list")
    if any(w < 0 for w in weights):
        raise ValueError(f"weights: negative entry in {list(weights)}")
    if sum(weights) != WEIGHT_ONE:
        raise ValueError(f"weights: sum {sum(weights)} != {WEIGHT_ONE}")


def pick(weights: Sequence[int], h: int) -> int:
    """Index of the candidate the hash value selects under fixed-point weights."""
    u = (h >> (64 - WEIGHT_BITS)) & (WEIGHT_ONE - 1)
    acc = 0
    for i, w in enumerate(weights):
        acc += w
        if u < acc:
            return i
    # Unreachable for valid weights (sum == WEIGHT_ONE > u); keep the first choice.
    return 0


def choose(seed: int, comm_id: int, bucket: int, call_index: int, weights: Sequence[int]) -> int:
    """The candidate index call `call_index` of `bucket` on `comm_id` tries."""
    return pick(weights, call_hash(seed, comm_id, bucket, call_index))


def to_fixed_point(probs: Sequence[float]) -> tuple[int, ...]:
    """Probabilities -> integer weights summing exactly to WEIGHT_ONE.

    Largest-remainder rounding with ties broken by index, so the result is a
    deterministic function of the inputs. Negative or non-finite entries are
    errors; an all-zero vector puts everything on the first candidate.
    """
    if not probs:
        raise ValueError("probs: empty")
    vals = [float(p) for p in probs]
    if any(not (p >= 0.0) or p == float("inf") for p in vals):
        raise ValueError(f"probs: entries must be finite and >= 0, got {vals}")
    total = sum(vals)
    if total <= 0.0:
        return (WEIGHT_ONE,) + (0,) * (len(vals) - 1)
    scaled = [p / total * WEIGHT_ONE for p in vals]
    floors = [int(s) for s in scaled]
    rest = WEIGHT_ONE - sum(floors)
    order = sorted(range(len(vals)), key=lambda i: (-(scaled[i] - floors[i]), i))
    for i in order[:rest]:
        floors[i] += 1
    return tuple(floors)

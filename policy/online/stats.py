"""Small statistics shared by the canary judge and the env-knob experiment.

`mean_var`: the mean and the sample variance (n - 1) of a few job-level figures.
`stable_hash64`: a 64-bit number from strings, the same on every machine and
Python run (sha256, unlike `hash`), for assigning jobs to slots and arms.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def mean_var(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance of `xs` (variance 0.0 for a single value)."""
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, 0.0
    return mean, sum((x - mean) ** 2 for x in xs) / (n - 1)


def stable_hash64(*parts: str) -> int:
    """The first 8 bytes (big-endian) of sha256 over the parts joined by NUL."""
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:8], "big")

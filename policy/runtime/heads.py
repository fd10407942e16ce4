"""The action heads' sizes and the masked-logit value (torch-free, shared by both runtimes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# Logit of an infeasible choice: low enough that it never wins, finite so that
# log-softmax stays finite (and comparable) for fully masked rows.
NEG_INF: Final = -1e9


@dataclass(frozen=True)
class HeadSizes:
    """Sizes of the four heads: algorithms, protocols, channel and chunk choices."""

    algo: int
    proto: int
    channels: int
    chunk: int

    @property
    def total(self) -> int:
        return self.algo + self.proto + self.channels + self.chunk

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.algo, self.proto, self.channels, self.chunk)

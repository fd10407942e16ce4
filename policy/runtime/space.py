"""The policy's action heads and joint feasibility masks.

Four heads (docs/policy.md, '2. Actions and masks'; `dynamiccl.api.table.Choice`):

- algorithm: NCCL's seven, in `NCCL_ALGO_*` order;
- protocol: LL, LL128, Simple;
- channels: 0 (= NCCL's own count) or one of `actions.NCHANNEL_CHOICES`;
- chunk: 0 (= NCCL's own chunk) or one of `actions.CHUNK_CHOICES`; a chunk size
  only means something for the Simple protocol (LL/LL128 move fixed lines), so
  LL and LL128 allow only 0.

Feasibility is NCCL's availability and the user's constraints for (algo, proto)
(`actions.action_mask`), times the allowed channel and chunk values: a joint
boolean tensor [A, P, C, K] per state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.nccl import Algo, Proto
from dynamiccl.api.table import Choice
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.runtime.actions import CHUNK_CHOICES, NCHANNEL_CHOICES, Constraints
from dynamiccl.policy.runtime.heads import HeadSizes

CHANNEL_OPTIONS: Final = (0, *NCHANNEL_CHOICES)
CHUNK_OPTIONS: Final = (0, *CHUNK_CHOICES)
HEADS: Final = HeadSizes(len(Algo), len(Proto), len(CHANNEL_OPTIONS), len(CHUNK_OPTIONS))
_SIMPLE: Final = Proto.SIMPLE.nccl_id

BoolArray = NDArray[np.bool_]


class ActionLimits(BaseModel):
    """The action constraints of an NCCLTuningPolicy, as the policy applies them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algos: frozenset[Algo] = frozenset(Algo)
    protos: frozenset[Proto] = frozenset(Proto)
    min_channels: int = Field(default=1, ge=1, le=64)
    max_channels: int = Field(default=64, ge=1, le=64)
    min_chunk: int = Field(default=0, ge=0)
    max_chunk: int = Field(default=1 << 30, ge=0)

    @classmethod
    def from_policy(cls, spec: NCCLTuningPolicySpec) -> ActionLimits:
        """The limits an NCCLTuningPolicy's `constraints` block sets."""
        c = spec.constraints
        return cls(
            algos=frozenset(c.allowed_algorithms),
            protos=frozenset(c.allowed_protocols),
            min_channels=c.channels.min,
            max_channels=c.channels.max,
            min_chunk=c.chunk_bytes.min,
            max_chunk=c.chunk_bytes.max,
        )

    def constraints(self) -> Constraints:
        """The simulator's (algo, proto, channel range) constraint object."""
        return Constraints(
            algos=self.algos,
            protos=self.protos,
            min_channels=self.min_channels,
            max_channels=self.max_channels,
        )

    def channel_ok(self) -> BoolArray:
        """[C]: which channel options are allowed (0 = NCCL's own: always)."""
        return np.array(
            [n == 0 or self.min_channels <= n <= self.max_channels for n in CHANNEL_OPTIONS]
        )

    def chunk_ok(self) -> BoolArray:
        """[K]: which chunk options are allowed (0 = NCCL's own: always)."""
        return np.array([k == 0 or self.min_chunk <= k <= self.max_chunk for k in CHUNK_OPTIONS])


def joint_mask(ap: BoolArray, limits: ActionLimits | None = None) -> BoolArray:
    """[..., A, P] (algo, proto) feasibility -> [..., A, P, C, K] joint feasibility."""
    lim = limits or ActionLimits()
    ch = lim.channel_ok()
    ck = np.broadcast_to(lim.chunk_ok(), (len(Proto), len(CHUNK_OPTIONS))).copy()
    ck[np.arange(len(Proto)) != _SIMPLE, 1:] = False  # chunk only for Simple
    out: BoolArray = ap[..., :, :, None, None] & ch[None, None, :, None] & ck[None, :, None, :]
    return out


def to_choice(action: Sequence[int]) -> Choice:
    """Head indices (algo, proto, channel option, chunk option) -> a table choice."""
    a, p, c, k = (int(x) for x in action)
    return Choice(
        algo=list(Algo)[a],
        proto=list(Proto)[p],
        nchannels=CHANNEL_OPTIONS[c],
        chunk_bytes=CHUNK_OPTIONS[k],
    )


def channel_index(nchannels: int | None) -> int:
    """The channel option nearest (in log2) to a channel count; None/0 -> NCCL's own."""
    if not nchannels:
        return 0
    opts = np.log2(np.array(CHANNEL_OPTIONS[1:], dtype=np.float64))
    return 1 + int(np.argmin(np.abs(opts - np.log2(nchannels))))


def chunk_index(chunk_bytes: int | None) -> int:
    """The chunk option nearest (in log2) to a chunk size; None/0 -> NCCL's own."""
    if not chunk_bytes:
        return 0
    opts = np.log2(np.array(CHUNK_OPTIONS[1:], dtype=np.float64))
    return 1 + int(np.argmin(np.abs(opts - np.log2(chunk_bytes))))

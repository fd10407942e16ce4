"""NCCL's enumerations with the integer ids of its public headers.

The ids are listed in docs/plugin.md, 'What the plugin relies on in NCCL'; the integer values
are what the plugin ABI carries. The names are the lower-case spellings of the response-surface
CSV (docs/simulator.md, '6. Response surfaces').
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Collective(StrEnum):
    """Collectives the tuner sees; value = CSV/CLI name."""

    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"

    @property
    def nccl_id(self) -> int:
        """`ncclFunc_t` value."""
        return _COLL_IDS[self]


class Algo(StrEnum):
    """NCCL algorithms; value = CSV/CLI name."""

    TREE = "tree"
    RING = "ring"
    COLLNET_DIRECT = "collnet_direct"
    COLLNET_CHAIN = "collnet_chain"
    NVLS = "nvls"
    NVLS_TREE = "nvls_tree"
    PAT = "pat"

    @property
    def nccl_id(self) -> int:
        """`NCCL_ALGO_*` index into the cost table."""
        return _ALGO_IDS[self]


class Proto(StrEnum):
    """NCCL protocols; value = CSV/CLI name."""

    LL = "ll"
    LL128 = "ll128"
    SIMPLE = "simple"

    @property
    def nccl_id(self) -> int:
        """`NCCL_PROTO_*` index into the cost table."""
        return _PROTO_IDS[self]


_COLL_IDS: Final = {c: i for i, c in enumerate(Collective)}
_ALGO_IDS: Final = {a: i for i, a in enumerate(Algo)}
_PROTO_IDS: Final = {p: i for i, p in enumerate(Proto)}

NUM_FUNCS: Final = 5
NUM_ALGORITHMS: Final = len(Algo)
NUM_PROTOCOLS: Final = len(Proto)

# NCCL's environment spellings (NCCL_ALGO / NCCL_PROTO values) for each enum.
ALGO_ENV_NAMES: Final = {
    Algo.TREE: "Tree",
    Algo.RING: "Ring",
    Algo.COLLNET_DIRECT: "CollnetDirect",
    Algo.COLLNET_CHAIN: "CollnetChain",
    Algo.NVLS: "NVLS",
    Algo.NVLS_TREE: "NVLSTree",
    Algo.PAT: "PAT",
}
PROTO_ENV_NAMES: Final = {Proto.LL: "LL", Proto.LL128: "LL128", Proto.SIMPLE: "Simple"}


def collective_from_id(nccl_id: int) -> Collective:
    """The collective for an `ncclFunc_t` value; ValueError if not tuned by us."""
    for coll, i in _COLL_IDS.items():
        if i == nccl_id:
            return coll
    raise ValueError(f"ncclFunc_t {nccl_id} is not a tuned collective (0..{NUM_FUNCS - 1})")


def algo_from_id(nccl_id: int) -> Algo:
    """The algorithm for an `NCCL_ALGO_*` index."""
    return list(Algo)[nccl_id]


def proto_from_id(nccl_id: int) -> Proto:
    """The protocol for an `NCCL_PROTO_*` index."""
    return list(Proto)[nccl_id]

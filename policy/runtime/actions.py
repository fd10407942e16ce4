"""The action space (algorithm, protocol, channels, chunk) and its feasibility masks.

Availability follows NCCL 2.27 (NVIDIA/nccl `src/graph/tuning.cc`
`ncclTopoTuneModel`, `src/enqueue.cc` `updateCollCostTable`,
`src/transport/nvls.cc` `ncclNvlsInit`); each rule carries the reason shown to
users. A tuner plugin can only choose among entries NCCL costed (docs/plugin.md, 'Decisions':
entries at -1 are ignored), so an unavailable entry is infeasible, not merely
discouraged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import Fabric
from dynamiccl.policy.sim.hardware import Arch
from dynamiccl.policy.sim.nccl_tables import MAX_DIRECT_ARITY_PLUS_ONE, MAX_NVLS_ARITY
from dynamiccl.policy.sim.system import System

ALGOS: Final = tuple(Algo)
PROTOS: Final = tuple(Proto)
COLLECTIVES: Final = tuple(Collective)
NCHANNEL_CHOICES: Final = (1, 2, 4, 8, 12, 16, 24, 32)
CHUNK_CHOICES: Final = (32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024, 512 * 1024, 1 << 20, 2 << 20)

# Which algorithms implement which collective (tuning.cc loop filters). NVLS
# allgather/reducescatter exist since NCCL 2.20 (2.20.3's tuning.cc lists NVLS for
# both), PAT since 2.23; this module follows 2.27.
_COLL_ALGOS: Final = {
    Collective.BROADCAST: {Algo.RING},
    Collective.REDUCE: {Algo.RING},
    Collective.ALLGATHER: {Algo.RING, Algo.PAT, Algo.NVLS, Algo.COLLNET_DIRECT},
    Collective.REDUCESCATTER: {Algo.RING, Algo.PAT, Algo.NVLS, Algo.COLLNET_DIRECT},
    Collective.ALLREDUCE: set(Algo) - {Algo.PAT},
}
_SIMPLE_ONLY: Final = {Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN, Algo.NVLS, Algo.NVLS_TREE, Algo.PAT}


def nvls_supported(system: System) -> bool:
    """NCCL's `nvlsSupport`: multicast hardware and more than 2 GPUs (nvls.cc)."""
    return (
        system.spec.nvls and system.nvswitch and system.gpu.nvls_capable and system.local_ranks > 2
    )


def collnet_supported(system: System) -> bool:
    """CollNet needs in-network aggregation (SHARP) and more than one node."""
    return system.spec.sharp and system.nodes > 1


def algo_reason(system: System, coll: Collective, algo: Algo) -> str | None:
    """Why `algo` is unavailable for `coll` on `system` (None: available)."""
    if system.ranks == 1:
        return None if algo is Algo.RING else "a single rank only runs Ring (enqueue.cc)"
    if algo not in _COLL_ALGOS[coll]:
        return f"NCCL has no {algo.value} implementation of {coll.value} (tuning.cc)"
    if algo in (Algo.NVLS, Algo.NVLS_TREE):
        if not nvls_supported(system):
            return "NVLS needs an NVSwitch with NVLink SHARP (nvls: true), Hopper+ and > 2 GPUs"
        if algo is Algo.NVLS_TREE and system.nodes == 1:
            return "NVLS_TREE is disabled on a single node (tuning.cc)"
        if algo is Algo.NVLS and system.nodes > 1 and not collnet_supported(system):
            return "multi-node NVLS needs CollNet/SHARP (tuning.cc)"
        if coll is not Collective.ALLREDUCE and system.local_ranks > MAX_NVLS_ARITY:
            return f"NVLS {coll.value} supports at most {MAX_NVLS_ARITY} local ranks"
        if (
            coll is not Collective.ALLREDUCE
            and system.nodes > 1
            and system.local_ranks > max(1, min(system.nics, system.local_ranks))
        ):
            return "multi-node NVLS allgather/reducescatter needs one NIC per GPU"
    if algo in (Algo.COLLNET_DIRECT, Algo.COLLNET_CHAIN):
        if not collnet_supported(system):
            return "CollNet needs in-network aggregation (sharp: true) and more than one node"
        if system.local_ranks > MAX_DIRECT_ARITY_PLUS_ONE:
            return f"CollNet supports at most {MAX_DIRECT_ARITY_PLUS_ONE} local GPUs (enqueue.cc)"
        if algo is Algo.COLLNET_DIRECT and not system.nvswitch:
            return "CollNet Direct needs an NVSwitch (tuning.cc)"
        if coll is not Collective.ALLREDUCE and system.local_ranks > system.nics:
            return "CollNet allgather/reducescatter needs one NIC per GPU (tuning.cc)"
    if algo is Algo.PAT:
        if system.nodes != system.ranks:
            return "PAT only runs with one GPU per node (tuning.cc ncclPatEnable)"
        if system.gpu.compute_capability < 60:
            return "PAT needs sm_60 or newer"
    return None


def proto_reason(system: System, coll: Collective, algo: Algo, proto: Proto) -> str | None:
    """Why (algo, proto) is unavailable (None: available); assumes the algorithm is."""
    if system.ranks == 1:
        return None if proto is Proto.SIMPLE else "a single rank only runs Simple"
    if algo in _SIMPLE_ONLY and proto is not Proto.SIMPLE:
        return f"{algo.value} only implements the Simple protocol"
    if proto is Proto.LL128 and not system.nvlink:
        return "LL128 is enabled by default only over NVLink (tuning.cc, typeIntra <= NVB)"
    if proto is Proto.LL128 and system.gpu.compute_capability < 70:
        return "LL128 needs sm_70 or newer"
    if (
        proto is not Proto.SIMPLE
        and system.nodes > 1
        and system.fabric is Fabric.EFA
        and system.gpu.arch < Arch.HOPPER
    ):
        return (
            "the AWS EFA plugin sets NCCL_PROTO=simple before p5 (aws/aws-ofi-nccl#76, #280, #850)"
        )
    return None


def nccl_available(system: System, coll: Collective) -> NDArray[np.bool_]:
    """[algo][proto] mask of what NCCL itself costs for `coll` on `system`."""
    mask = np.zeros((len(ALGOS), len(PROTOS)), dtype=bool)
    for a in ALGOS:
        if algo_reason(system, coll, a) is not None:
            continue
        for p in PROTOS:
            mask[a.nccl_id, p.nccl_id] = proto_reason(system, coll, a, p) is None
    return mask


class Constraints(BaseModel):
    """User constraints from the policy CR (allowed algorithms/protocols, channel range)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algos: frozenset[Algo] = frozenset(Algo)
    protos: frozenset[Proto] = frozenset(Proto)
    min_channels: int = Field(default=1, ge=1, le=64)
    max_channels: int = Field(default=64, ge=1, le=64)

    @model_validator(mode="after")
    def _range(self) -> Constraints:
        if self.min_channels > self.max_channels:
            raise ValueError(
                f"min_channels ({self.min_channels}) > max_channels ({self.max_channels})"
            )
        if not self.algos:
            raise ValueError("algos: at least one algorithm must be allowed")
        if not self.protos:
            raise ValueError("protos: at least one protocol must be allowed")
        return self


def action_mask(
    system: System, coll: Collective, constraints: Constraints | None = None
) -> NDArray[np.bool_]:
    """[algo][proto] mask: NCCL availability and the user's constraints."""
    mask = nccl_available(system, coll)
    if constraints is not None:
        for a in ALGOS:
            if a not in constraints.algos:
                mask[a.nccl_id, :] = False
        for p in PROTOS:
            if p not in constraints.protos:
                mask[:, p.nccl_id] = False
    return mask


def channel_choices(constraints: Constraints | None = None) -> tuple[int, ...]:
    """The channel counts the policy may pick (within the user's range)."""
    c = constraints or Constraints()
    return tuple(n for n in NCHANNEL_CHOICES if c.min_channels <= n <= c.max_channels)


def passthrough_reason(
    *, ccl_library: str = "nccl", in_network_aggregation: bool = False
) -> str | None:
    """Why the policy must not tune at all (None: tune).

    In-network aggregation (SHARP/CollNet actually in use) already moves the
    reduction into the switch and NCCL's choice is then structural; a library
    other than NCCL does not load our tuner plugin.
    """
    if ccl_library.strip().lower() != "nccl":
        return f"library {ccl_library!r} is not NCCL: passthrough"
    if in_network_aggregation:
        return "in-network aggregation is active: passthrough"
    return None


def infeasible_reason(
    system: System,
    coll: Collective,
    algo: Algo,
    proto: Proto,
    *,
    nchannels: int | None = None,
    constraints: Constraints | None = None,
) -> str | None:
    """One line saying why a concrete configuration cannot run (None: it can)."""
    reason = algo_reason(system, coll, algo) or proto_reason(system, coll, algo, proto)
    if reason is not None:
        return f"{algo.value}/{proto.value} unavailable for {coll.value}: {reason}"
    if nchannels is not None and not 1 <= nchannels <= 64:
        return f"nchannels: {nchannels} outside 1..64"
    if constraints is not None:
        if algo not in constraints.algos or proto not in constraints.protos:
            return f"{algo.value}/{proto.value} excluded by the user's constraints"
        if nchannels is not None and not (
            constraints.min_channels <= nchannels <= constraints.max_channels
        ):
            return f"nchannels: {nchannels} outside the allowed range"
    return None


def feasible_pairs(mask: NDArray[np.bool_]) -> Iterable[tuple[Algo, Proto]]:
    """The (algo, proto) pairs a mask allows, in NCCL's index order."""
    for a in ALGOS:
        for p in PROTOS:
            if mask[a.nccl_id, p.nccl_id]:
                yield a, p

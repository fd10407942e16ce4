"""Where the simulator's truth may disagree with NCCL's ranking, and the evidence for it.

The simulator never lets a configuration beat NCCL's own pick by more than
NCCL's own cost model allows (see `simulator.anchored`), except for the
configurations a departure below releases. Each departure names the
measurements that show NCCL's model to be wrong there; docs/simulator.md
repeats them. A gain the learned policy finds in the simulator can therefore
only come from one of these entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import Fabric
from dynamiccl.policy.runtime.actions import nvls_supported
from dynamiccl.policy.sim.hardware import Arch
from dynamiccl.policy.sim.system import System


@dataclass(frozen=True)
class Departure:
    """One documented disagreement between NCCL's cost model and measured reality."""

    id: str
    title: str
    evidence: tuple[str, ...]  # calibration row ids and published sources
    mechanism: str  # what the simulator's physics does that NCCL's model does not
    scope: Callable[[System, Collective], bool]
    released: frozenset[tuple[Algo, Proto]]  # configurations allowed to beat NCCL's pick
    # NCCL picks the evidence shows to be off (None: whatever NCCL picks).
    affects: frozenset[tuple[Algo, Proto]] | None = None

    def active(self, system: System, coll: Collective) -> bool:
        """Whether the departure applies to `coll` on `system`."""
        return self.scope(system, coll)


def _nvls_team(system: System, coll: Collective) -> bool:
    return (
        coll is Collective.ALLREDUCE
        and system.nodes == 1
        and nvls_supported(system)
        and system.gpu.arch == Arch.HOPPER
        and 5 <= system.local_ranks <= 8
    )


def _efa_ll(system: System, _: Collective) -> bool:
    return (
        system.fabric is Fabric.EFA
        and system.nodes > 1
        and not system.container_split
        and system.gpu.arch >= Arch.HOPPER
    )


REGISTRY: Final[tuple[Departure, ...]] = (
    Departure(
        id="nvls-small-team",
        title="NVLS all-reduce on 5-8 Hopper GPUs is faster than NCCL's model says",
        evidence=(
            "h200x5-ar-8g-nvls",
            "h200x5-ar-8g-ring",
            "h200x6-ar-8g-nvls",
            "h200x6-ar-8g-ring",
            "h200x7-ar-8g-nvls",
            "h200x7-ar-8g-ring",
            "h200x8-ar-8g-nvls",
            "h200x8-ar-8g-ring",
            "stas00/ml-engineering network/README.md (SHARP section)",
        ),
        mechanism=(
            "NCCL 2.27 sizes NVLS by its NVLS graph (g channels at the first search speed "
            "<= NVLink/(g+1)) times nvlsEfficiency 0.85 and (nCh-1)/nCh: for 5 GPUs that is a "
            "busBw of 300 GB/s against Ring's 360, so NCCL picks Ring; measured NVLS reaches "
            "414 GB/s busbw against Ring's 364 (+14 %). The simulator's NVLS bandwidth is "
            "nvls_eta(g) x NVLink bandwidth, fitted on the 5-8 GPU rows."
        ),
        scope=_nvls_team,
        released=frozenset({(Algo.NVLS, Proto.SIMPLE)}),
    ),
    Departure(
        id="efa-ll",
        title="The LL protocol across AWS EFA is far slower than NCCL's model says",
        evidence=(
            "p5-2n-ar-8k",
            "p5-2n-ar-64k",
            "p5-2n-ar-1m",
            "aws/aws-ofi-nccl#76 (EFA does not support the LL protocols)",
        ),
        mechanism=(
            "On 2x p5 NCCL's 64 KiB all-reduce (LL in NCCL's model) takes 135 us while the "
            "16x larger 1 MiB call takes 123 us, so at 64 KiB a configuration at least 9 % "
            "faster exists. The simulator multiplies LL's network bandwidth across EFA by "
            "efa_ll_factor (fitted on the p5 rows); LL128 and Simple keep their physics."
        ),
        scope=_efa_ll,
        released=frozenset((a, p) for a in Algo for p in (Proto.LL128, Proto.SIMPLE)),
        affects=frozenset((a, Proto.LL) for a in Algo),
    ),
)


def active(system: System, coll: Collective) -> tuple[Departure, ...]:
    """The departures that apply to `coll` on `system`."""
    return tuple(d for d in REGISTRY if d.active(system, coll))


def release_table(system: System, coll: Collective) -> NDArray[np.bool_]:
    """[pick algo][pick proto][algo][proto]: may (algo, proto) beat NCCL's pick?

    True where an active departure affects NCCL's pick and releases the
    configuration; the simulator anchors every other configuration.
    """
    n_a, n_p = len(Algo), len(Proto)
    table = np.zeros((n_a, n_p, n_a, n_p), dtype=bool)
    for d in active(system, coll):
        rel = np.zeros((n_a, n_p), dtype=bool)
        for a, p in d.released:
            rel[a.nccl_id, p.nccl_id] = True
        picks = np.ones((n_a, n_p), dtype=bool)
        if d.affects is not None:
            picks[:] = False
            for a, p in d.affects:
                picks[a.nccl_id, p.nccl_id] = True
        table |= picks[:, :, None, None] & rel[None, None, :, :]
    return table


def by_id(departure_id: str) -> Departure:
    """A registry entry by id (KeyError if unknown)."""
    for d in REGISTRY:
        if d.id == departure_id:
            return d
    raise KeyError(departure_id)

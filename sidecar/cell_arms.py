"""One decision-table cell as the online tuner sees it (sidecar/tuning.py): its arms and their
prior, its tuner and bookkeeping, its events.

Arms are the cell's ranked choices, its candidates and NCCL's own pick, in that order;
the prior puts the table's first choice (or, for a cell without choices, NCCL's pick)
first (`cell_arms`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynamiccl.api.rewards import EventKind, TunerEvent
from dynamiccl.api.table import WEIGHT_MAX, Cell
from dynamiccl.policy.online.tuner import BucketTuner
from dynamiccl.sidecar.attribution import Arm, arm_of

CellId = tuple[int, int, int]  # (scale, coll, bucket)


def cell_id(cell: Cell) -> CellId:
    return (cell.scale, cell.collective.nccl_id, cell.bucket)


def cell_event(cell: Cell, kind: EventKind, calls: int, message: str = "") -> TunerEvent:
    """A tuner event of `cell` after `calls` measured calls of it."""
    b = cell.bucket
    return TunerEvent(
        kind=kind,
        message=message[:256],
        collective=cell.collective,
        size_bucket=b,
        nbytes_min=1 << b,
        nbytes_max=(2 << b) - 1,
        call_index=calls,
    )


@dataclass
class CellTuner:
    """One cell's arms, tuner and bookkeeping."""

    cell: Cell
    arms: list[Arm]
    default_arm: int | None
    tuner: BucketTuner
    calls: int = 0
    since_epoch: int = 0
    round_calls: int = 0  # calls of the cell in the round before its last fold
    exploring: bool = True
    seen_events: int = 0
    index: dict[Arm, int] = field(default_factory=dict)  # arm -> its index in `arms`

    def __post_init__(self) -> None:
        self.index = {a: i for i, a in enumerate(self.arms)}


def cell_arms(cell: Cell, default: Arm | None) -> tuple[list[Arm], list[float], int | None]:
    arms: list[Arm] = []
    prior: list[float] = []
    top = max((c.weight for c in cell.candidates), default=1)
    for i, ch in enumerate(cell.choices):
        a = arm_of(ch)
        if a not in arms:
            arms.append(a)
            prior.append(2.0 * top if i == 0 else 1.0)
    for cand in cell.candidates:
        a = arm_of(cand)
        if a not in arms:
            arms.append(a)
            prior.append(float(cand.weight))
    d = None
    if default is not None:
        if default not in arms:
            # where NCCL decides, its pick weighs WEIGHT_MAX next to the candidates
            # (policy/runtime/compile.py), doubled as for a committed choice
            arms.append(default)
            prior.append(2.0 * WEIGHT_MAX if not cell.choices else 1.0)
        elif not cell.choices:
            prior[arms.index(default)] = 2.0 * top  # no forcing: NCCL's own pick is committed
        d = arms.index(default)
    return arms, prior, d

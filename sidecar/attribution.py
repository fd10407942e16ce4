"""Which table and which configuration a measured collective ran under (pure).

The plugin's table in effect at a communicator's call index ``i`` is the one of
the latest COMMITTED epoch with boundary ``K <= i`` (docs/plugin.md); the ring
record carries NCCL's per-communicator sequence number, which the harness and
NCCL advance once per collective like the tuner's call index. Within that
table the record's observed (algorithm, protocol, channels) is matched against
the cell's ranked choices (origin ``table``), then its exploration candidates
(``explore``); anything else is NCCL's own decision (``default``). A choice
with ``nchannels == 0`` leaves the channel count to NCCL and matches any count,
after the choices that pin exactly the observed count (arms that differ only
in chunk size cannot be told apart: the first one listed is credited).

An exploration candidate can name exactly what the cell runs anyway: NCCL's own
configuration in a cell without choices, or a choice's algorithm and protocol
at the channel count NCCL picks. One record cannot tell such a call from an
exploratory one, but their frequencies can: the plugin explores at most the
cell's explore probability of its calls (at most 1/4), so a configuration that
matches a candidate and makes up more than half of the cell's calls (after
`MIN_SEEN` of them) is the cell's own, and is credited to the choice it
matches or to NCCL (`default`). Before that, such calls count as exploratory
(a few, at no cost: they run what the cell runs).

Configurations are plain tuples ``(algo, proto, nchannels, chunk_bytes)`` of
NCCL ids (0 = NCCL's channels / chunk), the sidecar's arm keys.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from dynamiccl.api.nccl import algo_from_id, proto_from_id
from dynamiccl.api.rewards import Origin
from dynamiccl.api.table import Cell, Choice, DecisionTable, scale_class, size_bucket

Arm = tuple[int, int, int, int]  # (algo, proto, nchannels, chunk_bytes)
CellId = tuple[int, int, int]  # (collective, bucket, scale)
Observed = tuple[int, int, int]  # (algo, proto, nchannels) as the record shows it
MIN_SEEN: Final = 16  # calls of a cell before a configuration's share decides (see above)
# the origins as plain strings (an enum member's `.value` is a descriptor call per record)
TABLE: Final = Origin.TABLE.value
EXPLORE: Final = Origin.EXPLORE.value
DEFAULT: Final = Origin.DEFAULT.value


def arm_of(c: Choice) -> Arm:
    """The arm key of a table choice or candidate (weights dropped)."""
    return (c.algo.nccl_id, c.proto.nccl_id, c.nchannels, c.chunk_bytes)


def choice_of(arm: Arm) -> Choice:
    """A table choice for an arm key."""
    return Choice(
        algo=algo_from_id(arm[0]), proto=proto_from_id(arm[1]), nchannels=arm[2], chunk_bytes=arm[3]
    )


class Attributed(NamedTuple):
    """A measured call, placed."""

    table_version: int  # 0: no table (NCCL's choice everywhere)
    bucket: int
    scale: int
    origin: str
    arm: Arm


@dataclass(frozen=True)
class CellView:
    """A cell's choices and candidates as arm keys."""

    choices: tuple[Arm, ...]
    candidates: tuple[Arm, ...]


def _matches(arm: Arm, algo: int, proto: int, nchannels: int) -> bool:
    return arm[0] == algo and arm[1] == proto and arm[2] == nchannels


@dataclass
class TableView:
    """A decision table indexed for attribution."""

    table: DecisionTable
    cells: dict[CellId, CellView] = field(default_factory=dict)
    # per cell with candidates: how often each observed configuration ran, and the total
    seen: dict[CellId, dict[Observed, int]] = field(default_factory=dict)
    seen_total: dict[CellId, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c in self.table.cells:
            self.cells[(c.collective.nccl_id, c.bucket, c.scale)] = _view(c)

    @property
    def version(self) -> int:
        return self.table.version


def _view(c: Cell) -> CellView:
    return CellView(tuple(arm_of(x) for x in c.choices), tuple(arm_of(x) for x in c.candidates))


def classify(cell: CellView | None, algo: int, proto: int, nchannels: int) -> tuple[str, Arm]:
    """(origin, arm) of an observed configuration in a cell."""
    if cell is not None:
        for k in (nchannels, 0):  # a pinned channel count first, then "NCCL's count"
            for arm in cell.choices:
                if _matches(arm, algo, proto, k):
                    return TABLE, arm
            for arm in cell.candidates:
                if _matches(arm, algo, proto, k):
                    return EXPLORE, arm
    return DEFAULT, (algo, proto, 0, 0)


def _without_candidates(cell: CellView, algo: int, proto: int, nchannels: int) -> tuple[str, Arm]:
    """What the call is if it did not explore: a choice it matches, else NCCL's own."""
    return classify(CellView(cell.choices, ()), algo, proto, nchannels)


def _observe(view: TableView, cid: CellId, cell: CellView | None, got: Observed) -> tuple[str, Arm]:
    """`classify`, counting the cell's configurations to tell its own from explored ones."""
    origin, arm = classify(cell, *got)
    if cell is None or not cell.candidates:
        return origin, arm
    seen = view.seen.setdefault(cid, {})
    n = seen[got] = seen.get(got, 0) + 1
    total = view.seen_total[cid] = view.seen_total.get(cid, 0) + 1
    if origin == EXPLORE and total >= MIN_SEEN and 2 * n > total:
        return _without_candidates(cell, *got)
    return origin, arm


class History:
    """The committed epochs of the job, as the plugin applies them."""

    def __init__(self, committed: list[tuple[int, TableView]] | None = None) -> None:
        pairs = sorted(committed or [], key=lambda kv: kv[0])
        self._bounds = [k for k, _ in pairs]
        self._views = [v for _, v in pairs]

    def at(self, call_index: int) -> TableView | None:
        """The table in effect at a communicator's call index (None: NCCL's choice)."""
        i = bisect.bisect_right(self._bounds, call_index)
        return self._views[i - 1] if i else None

    @property
    def boundaries(self) -> list[int]:
        """The committed epochs' boundaries, in order."""
        return list(self._bounds)

    @property
    def latest(self) -> TableView | None:
        return self._views[-1] if self._views else None

    def __len__(self) -> int:
        return len(self._views)


def attribute(  # noqa: PLR0917 -- one measured call's fields
    history: History,
    coll: int,
    nbytes: int,
    nranks: int,
    nnodes: int,
    call_index: int,
    algo: int,
    proto: int,
    nchannels: int,
    *,
    scale: int | None = None,
) -> Attributed:
    """Place one measured call: table version, bucket, scale class (`scale`: precomputed
    `scale_class(nranks, nnodes)`), origin, arm."""
    bucket = size_bucket(nbytes)
    if scale is None:
        scale = scale_class(nranks, nnodes)
    view = history.at(call_index)
    if view is None:
        return Attributed(0, bucket, scale, DEFAULT, (algo, proto, 0, 0))
    cid = (coll, bucket, scale)
    origin, arm = _observe(view, cid, view.cells.get(cid), (algo, proto, nchannels))
    return Attributed(view.version, bucket, scale, origin, arm)

"""The guardrail's comparison arm of a `static` table (docs/policy.md §5).

A static table carries no exploration candidates, so nothing would ever measure
NCCL's own choice next to the table's, and the policy's `guardrails` could not
act. Compiled for mode `static`, every cell whose first choice is not NCCL's own
pick carries that pick (NCCL's algorithm and protocol, NCCL's channels and chunk)
as its one candidate, explored with probability `COMPARE_EXPLORE` halving every
`2**compare_half_life(min_samples)` calls of the cell: enough calls for the
guardrail's `minSamples` measurements of NCCL's choice (about twice as many in
all, most of them in the cell's first calls), then fewer and fewer. The sidecar's
guard (sidecar/static_guard.py) compares the two with the guardrail's own test and
reverts a cell whose choice is slower than NCCL's beyond `regressionThreshold`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import WEIGHT_MAX, Candidate, Cell
from dynamiccl.policy.runtime.cells import INITIAL_EXPLORE

COMPARE_EXPLORE: Final = INITIAL_EXPLORE  # a cell's first calls: one in four runs NCCL's pick
CellKey = tuple[Collective, int, int]  # (collective, bucket, scale class)


def compare_half_life(min_samples: int, explore: float = COMPARE_EXPLORE) -> int:
    """h with explore * 2**h >= min_samples: the cell's first 2**h calls already give the
    guardrail `min_samples` comparisons on average (2 * explore * 2**h in all)."""
    h = 0
    while explore * (1 << h) < min_samples and h < 63:
        h += 1
    return h


def with_comparison(cell: Cell, pick: tuple[Algo, Proto]) -> Cell:
    """`cell` with NCCL's own pick as its comparison candidate (unchanged where the cell's
    first choice already is NCCL's pick at NCCL's channels and chunk, or has no choice)."""
    if not cell.choices:
        return cell
    first = cell.choices[0]
    if (first.algo, first.proto, first.nchannels, first.chunk_bytes) == (*pick, 0, 0):
        return cell
    cand = Candidate(algo=pick[0], proto=pick[1], weight=WEIGHT_MAX)
    return cell.model_copy(update={"candidates": (cand,), "explore": COMPARE_EXPLORE})


def comparison_cells(
    cells: Iterable[Cell], picks: Mapping[CellKey, tuple[Algo, Proto]]
) -> list[Cell]:
    """Every cell with its comparison arm (`picks`: NCCL's pick per collective,
    bucket and scale class; a cell without one is left as it is)."""
    out = []
    for c in cells:
        pick = picks.get((c.collective, c.bucket, c.scale))
        out.append(with_comparison(c, pick) if pick is not None else c)
    return out

"""Measured beats modelled: a hardware class's findings over a job's compiled table (issue 29).

A finding (dynamiccl/api/learning.py `Finding`, computed by the learning loop:
operator/learning/findings.py) is a configuration several independent jobs of
the hardware class measured faster than NCCL's own choice in one cell. The model
is a generalisation; the finding is direct evidence. So every new learned job of
the class starts with it in that cell, whatever model version compiled the rest
of its table:

- the cell's first choice becomes the finding (the model's choices stay behind it
  as fallbacks, up to `MAX_CHOICES`);
- NCCL's own pair becomes the cell's one candidate, explored at `CONFIRM_RATE`:
  the job keeps measuring both arms, so the finding is confirmed (or withdrawn,
  when it stops holding) by every job that runs it, and the sidecar's guardrail
  and online tuner keep watching the cell (they watch cells with candidates).

A finding that stopped holding after jobs contradicted it (`withdrawn`: the surface
changed back, a guardrail reverted it) is withdrawn from every model's table too: a
cell whose first choice is its (algorithm, protocol) goes back to NCCL's own choice.
A model trained before the withdrawal learned the old gain, and it would otherwise
keep running it until its canary is judged (issue 29: `learning_sequence_bench.py
--change-back-after 6`; the retrain itself no longer learns it: policy/train/store_data.py).

Cells of scale classes the table does not hold are left to the sidecar.
`measured_cells` says which cells of a table came from findings (the TuningRun
lists them).
"""

from __future__ import annotations

from typing import Final

from dynamiccl.api.learning import ClassCoverage, Config, Finding
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import MAX_CHOICES, Candidate, Cell, Choice, DecisionTable, scale_class

CONFIRM_RATE: Final = 1.0 / 256  # NCCL's own pair in a finding's cell: confirm at a low rate

CellId = tuple[str, int, int]  # (collective, bucket, scale class)


def _choice(c: Config) -> Choice:
    return Choice(
        algo=Algo(c.algo), proto=Proto(c.proto), nchannels=c.nchannels, chunk_bytes=c.chunk_bytes
    )


def _cell_id(f: Finding) -> CellId:
    return (f.collective, f.size_bucket, scale_class(f.nranks, f.nnodes))


def _best(coverage: ClassCoverage | None) -> dict[CellId, Finding]:
    """The holding finding of each cell (the fastest where several hold)."""
    out: dict[CellId, Finding] = {}
    for f in coverage.holding() if coverage is not None else []:
        cid = _cell_id(f)
        if cid not in out or f.speedup > out[cid].speedup:
            out[cid] = f
    return out


def _apply(cell: Cell, f: Finding) -> Cell:
    first = _choice(f)
    rest = tuple(c for c in cell.choices if c != first)
    candidates: tuple[Candidate, ...] = ()
    if f.nccl_algo and f.nccl_proto:
        candidates = (Candidate(algo=Algo(f.nccl_algo), proto=Proto(f.nccl_proto)),)
    return cell.model_copy(
        update={
            "choices": (first, *rest)[:MAX_CHOICES],
            "candidates": candidates,
            "explore": CONFIRM_RATE if candidates else 0.0,
        }
    )


def _withdrawn(coverage: ClassCoverage | None) -> dict[CellId, set[tuple[Algo, Proto]]]:
    """Per cell, the (algorithm, protocol) of each finding jobs contradicted, not holding."""
    out: dict[CellId, set[tuple[Algo, Proto]]] = {}
    for f in coverage.findings if coverage is not None else []:
        if not f.holds and f.contradicting:
            out.setdefault(_cell_id(f), set()).add((Algo(f.algo), Proto(f.proto)))
    return out


def _back_to_nccl(cell: Cell, gone: set[tuple[Algo, Proto]]) -> Cell:
    """The cell, with NCCL's own choice where its first choice was withdrawn."""
    if cell.choices and (cell.choices[0].algo, cell.choices[0].proto) in gone:
        return cell.model_copy(update={"choices": ()})
    return cell


def apply_findings(table: DecisionTable, coverage: ClassCoverage | None) -> DecisionTable:
    """`table` with every holding finding of the class in its cell, and NCCL's own choice
    where the first choice is a withdrawn finding (module docstring)."""
    best, withdrawn = _best(coverage), _withdrawn(coverage)
    if not best and not withdrawn:
        return table
    cells: list[Cell] = []
    seen: set[CellId] = set()
    for cell in table.cells:
        cid = (cell.collective.value, cell.bucket, cell.scale)
        found = best.get(cid)
        seen.add(cid)
        if found is not None:
            cells.append(_apply(cell, found))
        else:
            cells.append(_back_to_nccl(cell, withdrawn.get(cid, set())))
    for cid, f in sorted(best.items()):
        if cid not in seen and cid[2] in table.scales:
            empty = Cell(collective=Collective(cid[0]), bucket=cid[1], scale=cid[2])
            cells.append(_apply(empty, f))
    return table.model_copy(update={"cells": tuple(cells)})


def measured_cells(table: DecisionTable, coverage: ClassCoverage | None) -> list[Finding]:
    """The holding findings `table` runs as its cells' first choice."""
    out = []
    for cid, f in sorted(_best(coverage).items()):
        cell = table.cell(Collective(cid[0]), cid[1], cid[2])
        if cell is not None and cell.choices and cell.choices[0] == _choice(f):
            out.append(f)
    return out


def describe(f: Finding) -> str:
    """One line for the TuningRun: cell, configuration, measured speedup, evidence."""
    ch = f"/{f.nchannels}ch" if f.nchannels else ""
    return (
        f"{f.collective}/b{f.size_bucket}/{f.nranks}x{f.nnodes}: {f.algo}/{f.proto}{ch} "
        f"{f.speedup:.3f}x NCCL's {f.nccl_algo}/{f.nccl_proto} ({f.supporting} jobs, "
        f"{f.namespaces} namespaces)"
    )

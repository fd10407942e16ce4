"""A job's exploration assignment: what its hardware class still lacks measurements for.

The compiled table (compile.py) ranks each cell's candidates by the policy's
prior. How much to explore, though, is not the prior's call: a cell no real
measurement has covered is uncertain whatever the simulator says, and a cell
the measurements of earlier jobs of the same hardware class settled needs no
more trying. `assign` rewrites a learned table's exploration from the class's
measured coverage (`status.learning`, dynamiccl/api/learning.py):

- a cell whose candidates were all measured (`MIN_CALLS` calls each, or ruled
  out: clearly slower after a few calls), or where a finding holds (several
  independent jobs measured a configuration faster than NCCL's own: every job
  then starts with it, policy/runtime/measured.py), explores nothing new: where its
  choice is not NCCL's own pair, it keeps NCCL's own pair (as the class measured NCCL
  run it) as its one candidate at `WATCH_RATE`, so the job's guardrail still watches
  the choice;
- a configuration some job measured faster than NCCL's own that is not (or no
  longer) a finding is one job's word: the cell explores only it (`confirm`, at
  `EXPLORE_CONFIRM`), whatever else is measured there, until enough jobs confirm
  it or more jobs refute it than support it (a tie stays open: one job's
  contradiction, true or not, does not end it); the cell's unmeasured candidates
  wait for the jobs after that;
- every other cell explores with `EXPLORE_UNSETTLED` (the same for every
  cell: the prior only ranks the candidates, it does not say how much), over the
  candidates nobody measured yet (the half-life is stretched so that a cell
  still explores about `budgetCalls` calls: at 1/128 an exploratory call
  twice as slow costs 0.8 % of the cell's time while it explores):
  the prior's `CANDIDATES_PER_JOB` best-ranked of them, taken from a window that
  rotates with the job (sha256 of its uid), so concurrent jobs of a class try
  different candidates and later jobs try what earlier ones did not.

Every job's exploration also has a hard cost cap (`exploration.budgetPercent`,
enforced by its sidecar: sidecar/explore_budget.py). Decisions stay identical on
every rank: the assignment is part of the table every rank receives.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.learning import ClassCoverage, Config, ConfigKey
from dynamiccl.api.nccl import Algo, Proto
from dynamiccl.api.table import (
    MAX_CANDIDATES,
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    scale_class,
)
from dynamiccl.policy.runtime.measured import CONFIRM_RATE

EXPLORE_UNSETTLED: Final = 1.0 / 128
# A cell with a configuration to confirm explores only it, 4x as often: the confirming job
# needs MIN_CALLS of it for a verdict before its budget's gate closes, which the other
# cells' slow candidates can close early (the e2e demo: ~10-40 exploratory calls per cell
# and job, half of them too few). One job measured it faster than NCCL's own: if that holds,
# these calls cost nothing; if it was a lie, the job's hard cost cap still bounds them.
EXPLORE_CONFIRM: Final = 4.0 / 128
CANDIDATES_PER_JOB: Final = 2
# A settled cell whose choice is not NCCL's own pair keeps NCCL's own pair as its one
# candidate at this rate (as a finding's cell does, policy/runtime/measured.py): a guardrail
# watches every cell of every model version (issue 29)
WATCH_RATE: Final = CONFIRM_RATE

CellId = tuple[str, int, int]  # (collective, bucket, scale class)


@dataclass(frozen=True)
class Assignment:
    """The table to run, and what the assignment did (for the TuningRun and tests)."""

    table: DecisionTable
    explored_cells: int  # cells this job explores
    settled_cells: int  # cells left alone because measurements settled them
    measured_candidates: int  # candidates dropped because they were measured already


def choice_key(c: Choice) -> ConfigKey:
    """(algorithm, protocol, channels, chunk bytes): a choice's or a candidate's configuration
    (a candidate's weight left out), as `Config.key` names a measured one."""
    return (c.algo.value, c.proto.value, c.nchannels, c.chunk_bytes)


def _known(coverage: ClassCoverage | None) -> dict[CellId, tuple[bool, set[ConfigKey]]]:
    """(a finding holds, measured configurations) per (collective, bucket, scale class)."""
    out: dict[CellId, tuple[bool, set[ConfigKey]]] = {}
    held = {
        (f.collective, f.size_bucket, scale_class(f.nranks, f.nnodes))
        for f in (coverage.holding() if coverage is not None else [])
    }
    for c in coverage.cells if coverage is not None else []:
        cid = (c.collective, c.size_bucket, scale_class(c.nranks, c.nnodes))
        _, keys = out.get(cid, (False, set()))
        out[cid] = (cid in held, keys | c.measured_keys())
    return out


def nccl_own_pairs(coverage: ClassCoverage | None) -> dict[CellId, Choice]:
    """Per (collective, bucket, scale class): the (algorithm, protocol) the class's jobs
    measured NCCL run as its own decision most often (`CellCoverage.measured` lists those
    first, most calls first), with NCCL's channels and chunk."""
    out: dict[CellId, Choice] = {}
    for cell in coverage.cells if coverage is not None else []:
        own = [m for m in cell.measured if m.nccl_own]
        cid = (cell.collective, cell.size_bucket, scale_class(cell.nranks, cell.nnodes))
        if own and cid not in out:
            try:
                out[cid] = Choice(algo=Algo(own[0].algo), proto=Proto(own[0].proto))
            except ValueError:  # not a pair a table can name
                continue
    return out


def _watched(cell: Cell, own: Choice | None) -> Cell:
    """A settled cell keeps its choice and, where that is not NCCL's own pair, NCCL's own
    pair as its one candidate at `WATCH_RATE`: the job's guardrail and tuner keep comparing
    the two (they watch cells with candidates), so a choice that stops being faster is
    reverted in the job and its rewards withdraw it for the class."""
    first = cell.choices[0]
    if own is None or choice_key(first) == choice_key(own):
        return cell.model_copy(update={"candidates": (), "explore": 0.0})
    watch = Candidate(algo=own.algo, proto=own.proto)
    return cell.model_copy(update={"candidates": (watch,), "explore": WATCH_RATE})


def candidate_of(c: Config) -> Candidate:
    """A configuration as an exploration candidate."""
    return Candidate(
        algo=Algo(c.algo), proto=Proto(c.proto), nchannels=c.nchannels, chunk_bytes=c.chunk_bytes
    )


def to_confirm(coverage: ClassCoverage | None) -> dict[CellId, list[Candidate]]:
    """Per cell, what some job measured faster than NCCL's own and no finding settles yet:
    not holding, and at least as many jobs for it as against it; or a departure (the class's pooled
    calls measured it faster) that no job has a verdict on yet, because no single job ran
    the `MIN_CALLS` of it and of NCCL's own a verdict needs (a large cell's few exploratory
    calls spread over jobs: the pooled calls would otherwise settle the cell with no finding
    ever made)."""
    if coverage is None:
        return {}
    out: dict[CellId, list[Candidate]] = {}
    judged: set[tuple[CellId, ConfigKey]] = set()
    for f in coverage.findings:
        cid = (f.collective, f.size_bucket, scale_class(f.nranks, f.nnodes))
        judged.add((cid, f.key))
        # a tie is still open: one contradicting job (a lie, or one noisy step verdict) must
        # not end the confirmation of what another job measured faster; more jobs decide
        if not f.holds and f.supporting >= f.contradicting:
            _add(out, cid, f)
    for d in coverage.departures:
        cid = (d.collective, d.size_bucket, scale_class(d.nranks, d.nnodes))
        if (cid, d.key) not in judged:
            _add(out, cid, d)
    return out


def _add(out: dict[CellId, list[Candidate]], cid: CellId, c: Config) -> None:
    try:
        out.setdefault(cid, []).append(candidate_of(c))
    except ValueError:  # not a configuration a table can name
        return


def job_window(job_uid: str, n: int) -> int:
    """The job's window among `n` (stable, uniform)."""
    if n <= 1:
        return 0
    return int.from_bytes(hashlib.sha256(job_uid.encode()).digest()[:8], "little") % n


def _explore_cell(
    cell: Cell, remaining: list[Candidate], job_uid: str, confirm: list[Candidate]
) -> Cell:
    if confirm:  # confirmed (or refuted) first; the cell's unmeasured candidates wait
        update = {"candidates": tuple(confirm[:MAX_CANDIDATES]), "explore": EXPLORE_CONFIRM}
        return cell.model_copy(update=update)
    windows = math.ceil(len(remaining) / CANDIDATES_PER_JOB)
    w = job_window(f"{job_uid}/{cell.collective.value}/{cell.bucket}/{cell.scale}", windows)
    window = remaining[w * CANDIDATES_PER_JOB : (w + 1) * CANDIDATES_PER_JOB]
    update = {"candidates": tuple(window), "explore": EXPLORE_UNSETTLED}
    return cell.model_copy(update=update)


def half_life(budget_calls: int) -> int:
    """log2 calls per halving so that sum_j EXPLORE_UNSETTLED * 2**-(j >> h) ~= budget_calls."""
    if budget_calls <= 0:
        return 0
    return max(0, min(63, round(math.log2(max(budget_calls / (2 * EXPLORE_UNSETTLED), 1.0)))))


def assign(
    table: DecisionTable, coverage: ClassCoverage | None, job_uid: str, budget_calls: int = 200
) -> Assignment:
    """The job's table with its exploration assignment (see the module docstring)."""
    known, pending, own = _known(coverage), to_confirm(coverage), nccl_own_pairs(coverage)
    cells: list[Cell] = []
    explored = settled = dropped = 0
    for cell in table.cells:
        cid = (cell.collective.value, cell.bucket, cell.scale)
        first = {choice_key(c) for c in cell.choices[:1]}
        confirm = [c for c in pending.get(cid, []) if choice_key(c) not in first]
        if not cell.candidates and not confirm:
            cells.append(cell)
            continue
        is_settled, measured = known.get(cid, (False, set()))
        keys = {choice_key(c) for c in confirm}
        remaining = [c for c in cell.candidates if choice_key(c) not in measured | keys]
        dropped += len(cell.candidates) - len(remaining)
        if is_settled or not (remaining or confirm):
            settled += 1
            if cell.choices:  # the table's choice stays, NCCL's own pair watches it
                cells.append(_watched(cell, own.get(cid)))
            continue
        explored += 1
        cells.append(_explore_cell(cell, remaining, job_uid, confirm))
    schedule = table.explore
    if explored and schedule.half_life_log2 is not None:
        longer = max(schedule.half_life_log2, half_life(budget_calls))
        schedule = schedule.model_copy(update={"half_life_log2": longer})
    out = table.model_copy(update={"cells": tuple(cells), "explore": schedule})
    return Assignment(out, explored, settled, dropped)

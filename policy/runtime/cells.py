"""A job's table cells from the policy's rankings, all calls of all scale classes at once.

`cells` turns the ranked configurations of every (scale class, collective, size bucket)
row into the table's cells with array operations; `cell` is the same rule for one row, in
plain Python (what a cell holds: compile.py's module docstring). They agree exactly:
`cells` works out each row's choices, candidates and the integer steps of its explore
probability and weights with numpy, and hands a row to `cell` whenever a step sits so
close to a rounding boundary that numpy's log2 (which differs from the C library's in
the last bit for some inputs) could round it the other way, or a row has nothing ranked.
Python objects are then only made per emitted cell, from cached choices and candidates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import MAX_CHOICES, WEIGHT_MAX, Candidate, Cell, Choice
from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS

INITIAL_EXPLORE: Final = 0.25
MIN_EXPLORE: Final = 2.0**-16  # the plugin's smallest non-zero explore probability
ALGOS: Final = tuple(Algo)
PROTOS: Final = tuple(Proto)
COLLS: Final = tuple(Collective)
_DIMS: Final = (len(Algo), len(Proto), len(CHANNEL_OPTIONS), len(CHUNK_OPTIONS))
_CODES: Final = math.prod(_DIMS)
_EDGE: Final = 1e-6  # a log2 step this close to a rounding boundary: the row goes to `cell`
I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


def _code(act: Sequence[int]) -> int:
    """A configuration's head indices as one integer (what `_codes` computes)."""
    return ((act[0] * _DIMS[1] + act[1]) * _DIMS[2] + act[2]) * _DIMS[3] + act[3]


def _codes(acts: I64) -> I64:
    """[..., 4] head indices -> [...] configuration codes."""
    a, p, c, k = (acts[..., i] for i in range(4))
    out: I64 = ((a * _DIMS[1] + p) * _DIMS[2] + c) * _DIMS[3] + k
    return out


@lru_cache(maxsize=_CODES)
def _choice(code: int) -> Choice:
    # Head indices come from fixed, valid option tables: skip re-validation (speed).
    rest, k = divmod(code, _DIMS[3])
    rest, c = divmod(rest, _DIMS[2])
    a, p = divmod(rest, _DIMS[1])
    return Choice.model_construct(
        algo=ALGOS[a], proto=PROTOS[p], nchannels=CHANNEL_OPTIONS[c], chunk_bytes=CHUNK_OPTIONS[k]
    )


@lru_cache(maxsize=65536)
def _candidate(code: int, weight: int) -> Candidate:
    return Candidate.model_construct(**dict(_choice(code)), weight=weight)


def _step_weight(q: int) -> int:
    w = round(WEIGHT_MAX * math.pow(2.0, q / 8))
    return max(1, min(WEIGHT_MAX, w))


# _step_weight(-i) for every step a weight can take (ratios 1 .. 1/WEIGHT_MAX)
_STEP_WEIGHTS: Final = tuple(_step_weight(-i) for i in range(round(8 * math.log2(WEIGHT_MAX)) + 1))
_WEIGHT_BY_STEP: Final = np.array(_STEP_WEIGHTS, dtype=np.int64)
# the explore probability of a cell NCCL decides, by -round(8 log2 share), share >= 2**-30
_EXPLORE_BY_STEP: Final = np.array(
    [max(INITIAL_EXPLORE * math.pow(2.0, -i / 8), MIN_EXPLORE) for i in range(241)]
)


def _weight(p: float, top: float) -> int:
    """Relative weight on a log scale with 1/8 octave steps (few distinct values)."""
    q = round(8 * math.log2(max(p / top, 1.0 / WEIGHT_MAX)))
    return _STEP_WEIGHTS[-q] if -len(_STEP_WEIGHTS) < q <= 0 else _step_weight(q)


_CELL_FIELDS: Final = frozenset(Cell.model_fields)
_setattr = object.__setattr__


def _new_cell(  # noqa: PLR0917 - a cell's fields
    coll: Collective,
    bucket: int,
    scale: int,
    choices: tuple[Choice, ...],
    candidates: tuple[Candidate, ...],
    explore: float,
) -> Cell:
    """`Cell.model_construct` of every field, without its per-field bookkeeping (speed):
    the values come from fixed, valid tables; the instance is the same (tested)."""
    m = Cell.__new__(Cell)
    d = {"collective": coll, "bucket": bucket, "scale": scale, "choices": choices}
    d["candidates"], d["explore"] = candidates, explore
    _setattr(m, "__dict__", d)
    _setattr(m, "__pydantic_fields_set__", set(_CELL_FIELDS))
    _setattr(m, "__pydantic_extra__", None)
    _setattr(m, "__pydantic_private__", None)
    return m


def cell(  # noqa: PLR0917 - one cell's coordinates and content
    coll: Collective,
    bucket: int,
    scale: int,
    acts: list[list[int]],
    probs: list[float],
    pick: list[int],
    n_cand: int,
) -> Cell | None:
    """One cell; None when the policy agrees with NCCL and there is nothing to explore."""
    kp = [(tuple(a), p) for a, p in zip(acts, probs, strict=True) if p > 0]
    default = (pick[0], pick[1], 0, 0)
    agrees = kp[0][0] == default
    ranked = [] if agrees else [k for k, _ in kp[:MAX_CHOICES]]
    cands: list[tuple[tuple[int, ...], float]] = []
    explore = INITIAL_EXPLORE
    top = 1.0
    if n_cand:
        rest = kp[len(ranked) :]  # the ranking holds each configuration once (merge_with_beam)
        if agrees:
            # NCCL decides here: its own pick is what runs unless a call explores, so it is
            # no candidate (a call running it is NCCL's default, not exploration). The
            # alternatives are explored as often as they were when NCCL's pick shared the
            # draw: in proportion to the policy's probability that they are better, but
            # never not at all: the cell stays, so the sidecar's tuner measures it.
            cands = [kp_ for kp_ in rest if kp_[0] != default][:n_cand]
            mass = sum(p for _, p in cands)
            p0 = kp[0][1]
            # 1/8-octave steps, like the weights: the torch and numpy policies agree
            share = max(mass / (mass + p0), 2.0**-30)
            explore = INITIAL_EXPLORE * math.pow(2.0, round(8 * math.log2(share)) / 8)
            explore = max(explore, MIN_EXPLORE)
            # weights relative to the more likely of NCCL's pick and the best alternative,
            # as when NCCL's pick was a candidate: the sidecar's tuner gives it WEIGHT_MAX
            top = max(p0, *(p for _, p in cands)) if cands else 1.0
        else:
            floor = max(kp[0][1] * 0.1, 1e-3)
            cands = [(default, floor), *[kp_ for kp_ in rest if kp_[0] != default]][:n_cand]
            top = max(p for _, p in cands)
    if not ranked and not cands:
        return None
    return _new_cell(
        coll,
        bucket,
        scale,
        tuple(_choice(_code(k)) for k in ranked),
        tuple(_candidate(_code(k), _weight(p, top)) for k, p in cands),
        explore if cands else 0.0,
    )


def _first(mask: NDArray[np.bool_], limit: I64, m: int) -> tuple[I64, I64]:
    """Per row, the column indices of its first `limit` (<= m) True entries [n, m] (then
    any columns) and how many there are [n]."""
    take = mask & (np.cumsum(mask, axis=1) <= limit[:, None])
    order: I64 = np.argsort(~take, axis=1, kind="stable")[:, :m]
    return order, take.sum(1)


def _steps(x: F64) -> tuple[I64, NDArray[np.bool_]]:
    """round(8 log2 x) and where that may round otherwise with Python's math.log2."""
    v = 8 * np.log2(x)
    q = np.round(v)
    return q.astype(np.int64), np.abs(np.abs(v - q) - 0.5) < _EDGE


class _Rows(NamedTuple):
    """Every row's cell content as arrays (see `cells`)."""

    ranked: I64  # [n, MAX_CHOICES] configuration codes, the first `n_ranked` used
    n_ranked: I64
    cands: I64  # [n, n_cand] configuration codes, the first `n_cands` used
    weights: I64  # [n, n_cand]
    n_cands: I64
    explore: F64
    by_rule: NDArray[np.bool_]  # rows `cell` decides (see the module docstring)


def _rows(acts: I64, probs: F64, picks: I64, n_cand: int) -> _Rows:
    n, k = probs.shape
    ix = np.arange(n)[:, None]
    positive = probs > 0
    order = np.argsort(~positive, axis=1, kind="stable")  # kp: the positive ones, in order
    code, p = _codes(acts)[ix, order], probs[ix, order]
    count = positive.sum(1)
    default = _codes(np.stack([picks[:, 0], picks[:, 1], 0 * picks[:, 0], 0 * picks[:, 0]], -1))
    agrees = code[:, 0] == default
    n_ranked = np.where(agrees, 0, np.minimum(count, MAX_CHOICES))
    by_rule = count == 0
    zeros = np.zeros(n, dtype=np.int64)
    if not n_cand:
        return _Rows(
            code[:, :MAX_CHOICES], n_ranked, code[:, :0], code[:, :0], zeros, np.zeros(n), by_rule
        )
    col = np.arange(k)[None, :]
    other = (col < count[:, None]) & (col >= n_ranked[:, None]) & (code != default[:, None])
    # agreeing rows: the first n_cand others; departing rows: NCCL's pick, then n_cand - 1
    idx, n_alt = _first(other, np.where(agrees, n_cand, n_cand - 1), n_cand)
    alt_c = code[ix, idx]
    alt_p = np.where(np.arange(n_cand)[None, :] < n_alt[:, None], p[ix, idx], 0.0)
    p0 = p[:, 0]
    floor = np.maximum(p0 * 0.1, 1e-3)
    cands = np.where(
        agrees[:, None], alt_c, np.concatenate([default[:, None], alt_c], 1)[:, :n_cand]
    )
    cand_p = np.where(
        agrees[:, None], alt_p, np.concatenate([floor[:, None], alt_p], 1)[:, :n_cand]
    )
    n_cands = np.where(agrees, n_alt, n_alt + 1)
    mass = alt_p[:, 0].copy()
    for j in range(1, n_cand):  # in order, as Python's sum adds them
        mass = mass + alt_p[:, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.maximum(mass / (mass + p0), 2.0**-30)
        q_e, edge_e = _steps(share)
        top = np.where(
            agrees & (n_cands == 0), 1.0, np.maximum(cand_p.max(1), np.where(agrees, p0, 0.0))
        )
        q_w, edge_w = _steps(np.maximum(cand_p / top[:, None], 1.0 / WEIGHT_MAX))
    used = np.arange(n_cand)[None, :] < n_cands[:, None]
    bad_w = used & (edge_w | (q_w > 0) | (q_w <= -len(_STEP_WEIGHTS)))
    by_rule |= bad_w.any(1) | (agrees & (n_cands > 0) & edge_e)
    weights = _WEIGHT_BY_STEP[np.clip(-q_w, 0, len(_STEP_WEIGHTS) - 1)]
    explore = np.where(agrees, _EXPLORE_BY_STEP[np.clip(-q_e, 0, 240)], INITIAL_EXPLORE)
    explore = np.where(n_cands > 0, explore, 0.0)
    return _Rows(code[:, :MAX_CHOICES], n_ranked, cands, weights, n_cands, explore, by_rule)


def cells(
    acts: I64,
    probs: F64,
    picks: I64,
    coords: tuple[I64, I64, I64],
    n_cand: int,
) -> list[Cell]:
    """The cells of rows of ranked configurations `acts` [n, k, 4] (head indices) with
    probabilities `probs` [n, k] and NCCL's (algo, proto) `picks` [n, 2]; `coords` gives
    each row's collective index, size bucket and scale class; rows that need no cell are
    left out. The same cells, in row order, as `cell` gives row by row."""
    r = _rows(acts, probs, picks, n_cand)
    emit = np.flatnonzero((r.n_ranked > 0) | (r.n_cands > 0) | r.by_rule)
    ranked, n_ranked = r.ranked[emit], r.n_ranked[emit]
    codes, weights, n_cands = r.cands[emit], r.weights[emit], r.n_cands[emit]
    # rows with the same choices (candidates) share one tuple, made once
    first, choices_of = _distinct(np.where(_used(n_ranked, ranked), ranked + 1, 0), 11)
    made_ch = [
        tuple(map(_choice, row[:n]))
        for row, n in zip(ranked[first].tolist(), n_ranked[first].tolist(), strict=True)
    ]
    pair = np.where(_used(n_cands, codes), codes * (WEIGHT_MAX + 1) + weights, -1) + 1
    first, cands_of = _distinct(pair, 28)
    made_ca = [
        tuple(map(_candidate, row[:n], w[:n]))
        for row, w, n in zip(
            codes[first].tolist(), weights[first].tolist(), n_cands[first].tolist(), strict=True
        )
    ]
    lists = [x[emit].tolist() for x in (*coords, r.explore, r.by_rule)]
    out: list[Cell] = []
    new, fields = Cell.__new__, _CELL_FIELDS
    for i, c, b, s, ex, rule, ch, ca in zip(
        emit.tolist(), *lists, choices_of.tolist(), cands_of.tolist(), strict=True
    ):
        if rule:
            one = cell(
                COLLS[c], b, s, acts[i].tolist(), probs[i].tolist(), picks[i].tolist(), n_cand
            )
            if one is not None:
                out.append(one)
            continue
        m = new(Cell)  # as _new_cell, inlined (speed)
        _setattr(
            m,
            "__dict__",
            {
                "collective": COLLS[c],
                "bucket": b,
                "scale": s,
                "choices": made_ch[ch],
                "candidates": made_ca[ca],
                "explore": ex,
            },
        )
        _setattr(m, "__pydantic_fields_set__", set(fields))
        _setattr(m, "__pydantic_extra__", None)
        _setattr(m, "__pydantic_private__", None)
        out.append(m)
    return out


def _used(n: I64, values: I64) -> NDArray[np.bool_]:
    """[rows, columns]: the columns before each row's count `n`."""
    used: NDArray[np.bool_] = np.arange(values.shape[1])[None, :] < n[:, None]
    return used


def _distinct(values: I64, bits: int) -> tuple[I64, I64]:
    """Rows of `values` [n, m] (each in [0, 2**bits)): the first row of each distinct one,
    and each row's index into those."""
    ids = np.zeros(len(values), dtype=np.int64)
    id_bits = 0
    for j in range(values.shape[1]):
        if id_bits + bits > 62:
            ids = np.unique(ids, return_inverse=True)[1].reshape(-1)
            id_bits = len(values).bit_length()
        ids = (ids << bits) | values[:, j]
        id_bits += bits
    _, first, which = np.unique(ids, return_index=True, return_inverse=True)
    return first, which.reshape(-1)

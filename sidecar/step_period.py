"""The period of one communicator's collective calls: how many calls make a training step (pure).

A training step issues the same collectives in the same order on every communicator,
step after step: DDP's gradient buckets, FSDP's all-gathers and reduce-scatters per
layer, a pipeline stage's tensor-parallel all-reduces per micro-batch. `find_period`
takes one communicator's calls in issue order (NCCL's per-communicator sequence
number; a lost record is a `LOST` placeholder) as tokens ``(collective, bytes)`` with
their GPU start times, and returns the shortest period ``p`` that passes two tests:

1. **Calls.** From some call on (the warm-up before it is ignored: DDP's parameter
   broadcasts, a first iteration with other buckets), the tokens are one template of
   ``p`` tokens over and over, at least `MIN_CYCLES` times, except for at most
   `EXTRA_RATE` of the calls: a greedy parse walks the template and skips a call that
   does not match (an extra call: a logging all-reduce every N steps). A wrong period
   that a sequence nearly has (FSDP's all-gather/reduce-scatter pairs repeat every 2
   calls inside the backward pass) needs many skips and fails.
2. **Time.** For each phase of the template, the gap to the next call agrees across
   cycles: a cycle's deviation is ``sum_j |gap[c, j] - median_c(gap[., j])|`` over the
   median cycle's length, and the mean deviation of the cycles is at most
   `TIME_TOL`. Cycles deviating by more than `OUTLIER` (a checkpoint pause) are left
   out of the mean if they are at most `OUTLIER_SHARE` of the cycles (none below 50
   cycles). A candidate shorter than the step whose calls look alike
   (tensor-parallel all-reduces of one size; DDP buckets that repeat layer after
   layer) carries the step's long quiet time (optimizer, forward pass) in one cycle
   of every k and fails; the step itself passes. A window that holds less than a
   whole step cannot show this: a part of a step can pass, and the caller must
   drop it when a longer quiet time comes (sidecar/steps.py).

Candidates: the autocorrelation of the token sequence for every shift at once (each
token mapped to a unit complex number of pseudo-random phase, one FFT; a shift's real
part estimates how many calls equal the call that many places later); only shifts
where at least `F_MIN` of the calls match are parsed, shortest first, and a candidate
that passes the call test but not the time test is kept, so its multiples are timed
without another parse. The returned template starts at the call after the cycle's
longest median gap: the first call after the step's quiet time.

Hand-written: no maintained library finds the exact period of a symbolic sequence with
insertions and a timing check (numpy's FFT is the only dependency; stumpy's matrix
profile and spectral period estimators work on real-valued series and return
approximate periods with no phase). Cost: one FFT of twice the window plus a parse
per surviving candidate, run only while a communicator is not locked (sidecar/steps.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

LOST: Final = -1  # a lost record (a gap in the communicator's sequence numbers)
MIN_CYCLES: Final = 3  # the template must be seen this many times
EXTRA_RATE: Final = 0.05  # calls the parse may skip, as a fraction of those parsed
TIME_TOL: Final = 0.08  # median relative L1 deviation of a cycle's gap profile
F_MIN: Final = 0.4  # autocorrelation (matching fraction) a candidate needs
OUTLIER: Final = 0.5  # a cycle whose gaps deviate by this (of a cycle's length) is an outlier
OUTLIER_SHARE: Final = 0.02  # at most this share of the cycles may be outliers (rounded down)
_M1: Final = np.uint64(0xBF58476D1CE4E5B9)
_M2: Final = np.uint64(0x94D049BB133111EB)

I64 = NDArray[np.int64]


def token(coll: int, nbytes: int) -> int:
    """One call's identity within its communicator: the collective and its bytes."""
    return coll | nbytes << 3


@dataclass(frozen=True)
class Period:
    """A communicator's step as its calls show it."""

    template: tuple[int, ...]  # the tokens of one step, from its first call
    offset: int  # index (in the window) of the first call of the first whole step
    cycle_ns: float  # median step length from the calls' GPU start times
    extra_rate: float  # calls skipped by the parse / calls parsed
    time_dev: float  # the time test's score (<= TIME_TOL)

    @property
    def calls(self) -> int:
        return len(self.template)


@dataclass(frozen=True)
class _Parse:
    index: I64  # window index of each matched call
    ordinal: I64  # its place in the periodic sequence (lost calls take one too)
    skipped: int
    parsed: int


def _mix(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """splitmix64's finaliser: nearby tokens get unrelated phases."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return np.asarray(x ^ (x >> np.uint64(31)), dtype=np.uint64)


def match_fractions(tokens: Sequence[int] | I64, max_shift: int) -> NDArray[np.float64]:
    """Estimated fraction of calls equal to the call `p` places later, for p in 0..max_shift."""
    t = np.asarray(tokens, dtype=np.int64)
    n = len(t)
    phase = _mix(t.astype(np.uint64)) >> np.uint64(11)
    z = np.exp(2j * np.pi * phase.astype(np.float64) / float(1 << 53))
    z[t == LOST] = 0.0
    size = 1 << int(2 * n - 1).bit_length()
    spec = np.fft.fft(z, size)
    corr = np.fft.ifft(spec * np.conj(spec)).real[: max_shift + 1]
    return np.asarray(corr / np.maximum(n - np.arange(max_shift + 1), 1), dtype=np.float64)


def _first_double(tokens: I64, p: int) -> int | None:
    """The first index i with tokens[i:i+p] == tokens[i+p:i+2p] (no lost calls), or None."""
    if len(tokens) < 2 * p:
        return None
    eq = (tokens[:-p] == tokens[p:]) & (tokens[:-p] != LOST)
    run = np.convolve(eq.astype(np.int32), np.ones(p, dtype=np.int32), mode="valid")
    hits = np.flatnonzero(run == p)
    return int(hits[0]) if len(hits) else None


def _parse(tokens: list[int], template: list[int], start: int) -> _Parse | None:
    """Walk the template from `start`, skipping calls that do not match; None past the limit."""
    p, pos, ordinal, skipped = len(template), 0, 0, 0
    limit = EXTRA_RATE * (len(tokens) - start) + 1
    index: list[int] = []
    ords: list[int] = []
    for i in range(start, len(tokens)):
        t = tokens[i]
        if t == LOST or t == template[pos]:
            if t != LOST:
                index.append(i)
                ords.append(ordinal)
            ordinal += 1
            pos = pos + 1 if pos + 1 < p else 0
        else:
            skipped += 1
            if skipped > limit:
                return None
    if ordinal < MIN_CYCLES * p:
        return None
    return _Parse(np.asarray(index), np.asarray(ords), skipped, len(tokens) - start)


def _gap_rows(parse: _Parse, starts: I64, p: int) -> NDArray[np.float64]:
    """Per whole cycle (rows), the gap from each phase's call to the next call (columns)."""
    t = np.full(int(parse.ordinal[-1]) + 1, np.nan)
    t[parse.ordinal] = starts[parse.index]
    gaps = np.diff(t)  # gaps[k]: from ordinal k (phase k % p) to k + 1
    rows = len(gaps) // p
    g = gaps[: rows * p].reshape(rows, p)
    return np.asarray(g[~np.isnan(g).any(axis=1)], dtype=np.float64)


def _lengths_agree(parse: _Parse, starts: I64, p: int) -> bool:
    """Cheap necessary condition: most cycles (from phase 0) last about as long as the median."""
    t = np.full(int(parse.ordinal[-1]) + 1, np.nan)
    t[parse.ordinal] = starts[parse.index]
    d = np.diff(t[::p])
    d = d[~np.isnan(d)]
    if len(d) < MIN_CYCLES - 1:
        return False
    med = float(np.median(d))
    return bool(med > 0 and np.mean(np.abs(d - med) <= 2 * TIME_TOL * med) >= 0.8)


def _time_check(parse: _Parse, starts: I64, p: int) -> tuple[float, NDArray[np.float64]] | None:
    """(score, median gap profile), or None when the cycles' timing rules the period out."""
    if not _lengths_agree(parse, starts, p):
        return None
    g = _gap_rows(parse, starts, p)
    if len(g) < MIN_CYCLES - 1:
        return None
    prof = np.median(g, axis=0)
    length = float(prof.sum())
    if length <= 0:
        return None
    dev = np.abs(g - prof).sum(axis=1) / length
    out = dev > OUTLIER
    if out.sum() > OUTLIER_SHARE * len(out):
        return None
    return float(dev[~out].mean()), prof


def _accept(tokens: I64, starts: I64, parse: _Parse, template: list[int]) -> Period | None:
    p = len(template)
    timed = _time_check(parse, starts, p)
    if timed is None or timed[0] > TIME_TOL:
        return None
    score, prof = timed
    first_phase = (int(np.argmax(prof)) + 1) % p  # the call after the longest quiet time
    on = np.flatnonzero(parse.ordinal % p == first_phase)
    offset = int(parse.index[on[0]]) if len(on) else int(parse.index[0])
    rotated = tuple(template[first_phase:] + template[:first_phase])
    return Period(
        template=rotated,
        offset=offset,
        cycle_ns=float(prof.sum()),
        extra_rate=parse.skipped / max(parse.parsed, 1),
        time_dev=score,
    )


def find_period(
    tokens: Sequence[int], starts: Sequence[int], *, max_period: int = 2048
) -> Period | None:
    """The shortest period that passes the call and time tests (module docstring), or None."""
    n = len(tokens)
    if n != len(starts):
        raise ValueError(f"tokens and starts differ in length ({n} != {len(starts)})")
    top = min(max_period, n // MIN_CYCLES)
    if top < 1:
        return None
    tok = np.asarray(tokens, dtype=np.int64)
    st = np.asarray(starts, dtype=np.int64)
    frac = match_fractions(tok, top)
    as_list: list[int] = tok.tolist()
    parsed: list[tuple[int, _Parse, list[int]]] = []  # call test passed, time test failed
    for p in (int(x) for x in np.flatnonzero(frac[1:] >= F_MIN) + 1):
        base = next(((q, pq, tq) for q, pq, tq in parsed if p % q == 0), None)
        if base is not None:  # the same parse: a multiple of a token period
            q, parse, tq = base
            template = tq * (p // q)
            if int(parse.ordinal[-1]) + 1 < MIN_CYCLES * p:
                continue
        else:
            i = _first_double(tok, p)
            if i is None:
                continue
            template = as_list[i : i + p]
            got = _parse(as_list, template, i)
            if got is None:
                continue
            parse = got
        found = _accept(tok, st, parse, template)
        if found is not None:
            return found
        if base is None:
            parsed.append((p, parse, template))
    return None

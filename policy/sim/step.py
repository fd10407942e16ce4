"""A training step of compute and overlapped communication, where NCCL's channels take SMs.

A faster collective can make the step slower: each NCCL channel runs as one thread
block (CTA) of the collective's kernel, resident on one SM for the kernel's whole
run (NCCL launches a collective with one block per channel; the profiler reports
one `KernelCh` event per channel, docs/plugin.md), and a GPU has a fixed number of
SMs (NVIDIA's datasheets and architecture whitepapers: A100 108, H100 SXM5 132,
H200 132, B200 148; `SM_COUNT`). Compute kernels overlapped with the collective
(DDP's backward pass while gradient buckets are all-reduced) get the SMs the
collective leaves.

Rule (`overlap_rate`): the compute fills `compute_sms` of the GPU's `sms` SMs
(default all of them: a large GEMM launches more tiles than there are SMs); the
channels beyond the SMs that the compute leaves free, ``max(0, c - (sms -
compute_sms))``, are taken from it, and the overlapped compute runs at the rate
``(compute_sms - taken) / compute_sms``, proportionally slower. Communication is
taken to be bandwidth-bound and not slowed by the compute.

Timeline (`simulate`, DDP's order): a forward pass of `pre_us` with no
communication; a backward pass of `overlap_us` of compute during which bucket k is
ready once the fraction `ready[k]` of the backward compute is done; the buckets
run one after another on one stream, each from when it is ready and the stream is
free, for the configuration's time `comm_us[k]` (for example the simulator's
`Simulator.times` for that algorithm, protocol and channel count); the compute
runs at `overlap_rate` while a bucket is in flight and at full rate otherwise;
then `post_us` (the optimizer). The step is ``pre_us + max(end of compute, end of
communication) + post_us``. `step_time` is the same with the compute split by an
overlap fraction and the communication in equal buckets ready at even intervals.

Two regimes follow. Overlap-bound (the buckets hide behind the backward pass):
the step is the compute plus what the channels take from it, so more channels
can make the all-reduce faster and the step slower. Communication-bound (the
buckets outlast the compute): the step follows the communication, and a faster
all-reduce makes a faster step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# SMs per GPU (NVIDIA datasheets / architecture whitepapers), by the catalog's names
# (policy/sim/hardware.py): H100 is the SXM5 part (the PCIe card has 114).
SM_COUNT: Final[dict[str, int]] = {"A100": 108, "H100": 132, "H200": 132, "B200": 148}


class StepModelError(ValueError):
    """Inconsistent step parameters; the message names the field."""


def sm_count(gpu: str) -> int:
    """The SM count of a GPU of the catalog (StepModelError if not known here)."""
    try:
        return SM_COUNT[gpu]
    except KeyError:
        raise StepModelError(
            f"gpu: no SM count for {gpu!r}; known: {', '.join(SM_COUNT)}"
        ) from None


def overlap_rate(sms: int, compute_sms: int, channels: int) -> float:
    """Rate of overlapped compute while a collective with `channels` channels runs."""
    if not 0 < compute_sms <= sms:
        raise StepModelError(f"compute_sms: must be in 1..{sms} (got {compute_sms})")
    if not 0 <= channels <= sms:
        raise StepModelError(f"channels: must be in 0..{sms} (got {channels})")
    taken = max(0, channels - (sms - compute_sms))
    return max(compute_sms - taken, 0) / compute_sms


@dataclass(frozen=True)
class StepSpec:
    """One training step's compute (us) and when its buckets become ready."""

    pre_us: float  # forward pass: no communication
    overlap_us: float  # backward pass: buckets are all-reduced during it
    ready: tuple[float, ...]  # per bucket: fraction of the backward compute done when ready
    post_us: float = 0.0  # optimizer
    sms: int = 132
    compute_sms: int = 132

    def __post_init__(self) -> None:
        if min(self.pre_us, self.overlap_us, self.post_us) < 0:
            raise StepModelError("pre_us, overlap_us, post_us: must be >= 0")
        if any(not 0.0 <= f <= 1.0 for f in self.ready) or list(self.ready) != sorted(self.ready):
            raise StepModelError("ready: fractions in [0, 1], in bucket order")


@dataclass(frozen=True)
class StepTime:
    step_us: float
    compute_end_us: float  # from the step's start
    comm_end_us: float
    rate: float  # overlapped compute's rate while a bucket runs


def _advance(t: float, done: float, target: float, busy: float, rate: float) -> float:
    """Time at which the backward compute, at `done` work at time `t`, reaches `target`,
    running at `rate` until `busy` (the stream is busy from t to then) and 1 after."""
    need = target - done
    if need <= 0:
        return t
    if t < busy:
        slow = busy - t
        if rate > 0 and rate * slow >= need:
            return t + need / rate
        need -= rate * slow
        t = busy
    return t + need


def simulate(spec: StepSpec, comm_us: Sequence[float], channels: int) -> StepTime:
    """The step's time with these buckets' communication times at `channels` channels."""
    if len(comm_us) != len(spec.ready):
        raise StepModelError(f"comm_us: {len(comm_us)} buckets, ready has {len(spec.ready)}")
    if any(c < 0 for c in comm_us):
        raise StepModelError("comm_us: must be >= 0")
    rate = overlap_rate(spec.sms, spec.compute_sms, channels)
    t, done, busy = spec.pre_us, 0.0, spec.pre_us
    for frac, dur in zip(spec.ready, comm_us, strict=True):
        target = frac * spec.overlap_us
        t = _advance(t, done, target, busy, rate)
        done = max(done, target)
        busy = max(t, busy) + dur
    end = _advance(t, done, spec.overlap_us, busy, rate)
    return StepTime(max(end, busy) + spec.post_us, end, busy, rate)


def step_time(
    compute_us: float,
    comm_us: float,
    overlap: float,
    channels: int,
    *,
    gpu: str = "H100",
    buckets: int = 24,
    compute_sms: int | None = None,
) -> StepTime:
    """Step of `compute_us` compute, the fraction `overlap` of it able to hide `comm_us` of
    communication in `buckets` equal buckets ready at even intervals of that compute."""
    if not 0.0 <= overlap <= 1.0:
        raise StepModelError(f"overlap: must be in [0, 1] (got {overlap})")
    if buckets < 1:
        raise StepModelError(f"buckets: must be >= 1 (got {buckets})")
    sms = sm_count(gpu)
    spec = StepSpec(
        pre_us=(1.0 - overlap) * compute_us,
        overlap_us=overlap * compute_us,
        ready=tuple((k + 1) / buckets for k in range(buckets)),
        sms=sms,
        compute_sms=sms if compute_sms is None else compute_sms,
    )
    return simulate(spec, [comm_us / buckets] * buckets, channels)

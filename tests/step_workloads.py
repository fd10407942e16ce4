"""Collective call sequences of real training loops, as one process's profiler ring shows them.

Each generator returns a `Workload`: the records one process's ring would hold (ring
order = completion order; NCCL's per-communicator sequence numbers in issue order;
GPU start/stop times in ns), the true start time of every step (the start of its
first compute), and each communicator's calls of one steady-state step. Only
collectives are recorded (docs/plugin.md: the profiler enables Coll and KernelCh
events; a pipeline's point-to-point sends and receives are not collectives).

Timing: compute phases are lognormal around their mean (sigma 2 %), one step in
50 has a data-loader stall (+15 % of the step), a collective takes 8 us plus its
bytes at 100 GB/s (lognormal, sigma 3 %), and a collective starts when it is issued
and its stream is free. Orders are the frameworks' own:

- DDP (`ddp`): PyTorch DDP's gradient buckets built in reverse parameter order, the
  first capped at 1 MiB and the others at 25 MiB (a bucket closes once it reaches
  its cap), each all-reduced when its last gradient is ready during backward; the
  parameter broadcasts of the constructor (250 MiB coalesced) and a first iteration
  with 25 MiB buckets throughout before the steady buckets (DDP rebuilds them after
  the first iteration); a loss all-reduce every step and a metrics all-reduce every
  `log_every` steps.
- FSDP (`fsdp`): FULL_SHARD with forward prefetch and BACKWARD_PRE: forward
  all-gathers of the embedding, each layer and the head; backward re-gathers each
  layer, the next layer's all-gather issued before the current reduce-scatter; the
  all-gathers and reduce-scatters run on two streams of one communicator.
- 1F1B (`one_f_one_b`): one stage of a pipeline of `stages` stages and `micro`
  micro-batches with Megatron's schedule (warm-up forwards, one forward one
  backward, cool-down backwards; stage times from the whole pipeline's
  dependencies), tensor-parallel all-reduces (2 per layer forward, 2 backward, all of
  one size), the distributed optimizer's gradient reduce-scatters and parameter
  all-gathers on the data-parallel communicator, the gradient-norm and inf checks on
  the model-parallel one and, on the first and last stage, the embedding all-reduce.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

AG, RS, AR, BCAST = 2, 3, 4, 0
MIB = 1 << 20
DP, TP, MP, EMB = 0xD0, 0x70, 0x30, 0xE0  # communicator ids


@dataclass
class Workload:
    name: str
    records: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    step_starts: list[int] = field(default_factory=list)  # ns, true
    per_step: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


class _Ring:
    """Calls as issued; `records()` in completion order with per-communicator sequences."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.calls: list[tuple[int, int, int, int, int, int]] = []
        self.stream_free: dict[object, int] = {}
        self.seq: dict[int, int] = {}

    def jit(self, mean_ns: float, sigma: float = 0.02) -> int:
        return int(mean_ns * self.rng.lognormvariate(0.0, sigma))

    def call(self, comm: int, coll: int, nbytes: int, issue: int, stream: object = None) -> int:
        """Issue one collective; returns its GPU stop time."""
        key = stream if stream is not None else comm
        start = max(issue, self.stream_free.get(key, 0)) + 2_000
        stop = start + self.jit(8_000 + nbytes / 100.0, 0.03)  # 100 GB/s = 100 B/ns
        self.stream_free[key] = stop
        seq = self.seq.get(comm, 0)
        self.seq[comm] = seq + 1
        self.calls.append((stop, comm, coll, nbytes, seq, start))
        return stop

    def records(self) -> list[tuple[int, int, int, int, int]]:
        return [(c, k, b, q, s) for _, c, k, b, q, s in sorted(self.calls)]


def _stall(rng: random.Random, step_ns: float) -> int:
    return int(0.15 * step_ns) if rng.random() < 0.02 else 0


def gpt_params(layers: int, hidden: int, vocab: int = 50304) -> list[int]:
    """Parameter tensor sizes (elements) in definition order."""
    h = hidden
    out = [vocab * h]
    for _ in range(layers):
        out += [h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h]
    return [*out, h, h]


def ddp_buckets(grad_bytes: list[int], first_cap: int, cap: int) -> list[tuple[int, float]]:
    """(bucket bytes, fraction of backward done when it is ready), reverse parameter order."""
    total, done, size, limit = sum(grad_bytes), 0, 0, first_cap
    out = []
    for b in reversed(grad_bytes):
        size += b
        done += b
        if size >= limit:
            out.append((size, done / total))
            size, limit = 0, cap
    if size:
        out.append((size, 1.0))
    return out


def ddp(
    steps: int = 60, seed: int = 1, log_every: int = 10, layers: int = 24, change_at: int = 0
) -> Workload:
    """`change_at` > 0: from that step on, the first half of the parameters is frozen (no
    gradients: fewer buckets), as when a fine-tuning job unfreezes or freezes layers."""
    rng = random.Random(seed)
    ring = _Ring(rng)
    grads = [4 * n for n in gpt_params(layers, 2048)]
    steady = ddp_buckets(grads, 1 * MIB, 25 * MIB)
    frozen = ddp_buckets(grads[len(grads) // 2 :], 1 * MIB, 25 * MIB)
    first = ddp_buckets(grads, 25 * MIB, 25 * MIB)
    fwd, bwd, opt = 30e6, 60e6, 8e6
    w = Workload("DDP")
    t = 0
    for b in range(0, sum(grads), 250 * MIB):  # constructor: module state broadcasts
        t = ring.call(DP, BCAST, min(250 * MIB, sum(grads) - b), t)
    t += 5_000_000
    for k in range(steps):
        w.step_starts.append(t)
        f_end = t + ring.jit(fwd)
        b_len = ring.jit(bwd)
        last = 0
        changed = 0 < change_at <= k
        for size, frac in first if k == 0 else frozen if changed else steady:
            last = ring.call(DP, AR, size, f_end + int(frac * (b_len // (2 if changed else 1))))
        t = max(f_end + b_len, last) + ring.jit(opt)
        t = ring.call(DP, AR, 8, t)  # the loss, for logging
        if log_every and k % log_every == log_every - 1:
            t = ring.call(DP, AR, 64, t)  # metrics
        t += ring.jit(2e6) + _stall(rng, fwd + bwd)
    w.per_step[DP] = [(AR, s) for s, _ in (frozen if change_at else steady)] + [(AR, 8)]
    w.records = ring.records()
    return w


def fsdp(steps: int = 40, seed: int = 2, layers: int = 32) -> Workload:
    rng = random.Random(seed)
    ring = _Ring(rng)
    h = 4096
    unit, emb, head = 2 * 12 * h * h, 2 * 32000 * h, 2 * 32000 * h + 2 * h
    f_layer, opt = 3e6, 10e6
    w = Workload("FSDP")
    t = 0
    for _k in range(steps):
        w.step_starts.append(t)
        seq: list[tuple[int, int]] = []

        def gather(nbytes: int, issue: int, seq: list[tuple[int, int]] = seq) -> int:
            seq.append((AG, nbytes))
            return ring.call(DP, AG, nbytes, issue, stream="ag")

        def scatter(nbytes: int, issue: int, seq: list[tuple[int, int]] = seq) -> int:
            seq.append((RS, nbytes))
            return ring.call(DP, RS, nbytes, issue, stream="rs")

        ready = [gather(emb, t)]
        for _ in range(layers):  # forward prefetch: the next gather at once
            ready.append(gather(unit, t))
        ready.append(gather(head, t))
        c = t
        for r in ready:
            c = max(c, r) + ring.jit(f_layer)
        c += ring.jit(2 * f_layer)  # head backward
        rs_end = scatter(head, c)
        nxt = gather(unit, c)
        for i in range(layers):  # layers in reverse: prefetch the next, then scatter this one
            start = max(c, nxt)
            nxt = gather(unit, start) if i + 1 < layers else start
            c = start + ring.jit(2 * f_layer)
            rs_end = scatter(unit, c)
        rs_end = scatter(emb, c + ring.jit(1e6))
        t = max(c, rs_end) + ring.jit(opt)
        seq.append((AR, 4))
        t = ring.call(DP, AR, 4, t)
        t += ring.jit(2e6) + _stall(rng, (layers + 2) * 3 * f_layer)
        w.per_step[DP] = seq
    w.records = ring.records()
    return w


def schedule_1f1b(
    stages: int, micro: int, rng: random.Random, tf: float, t0: list[int]
) -> list[list[tuple[str, int, int]]]:
    """Per stage, its (kind, start, stop) ops in Megatron's 1F1B order."""
    order = []
    for s in range(stages):
        warm = min(stages - s - 1, micro)
        ops = [("F", i) for i in range(warm)]
        for i in range(micro - warm):
            ops += [("F", warm + i), ("B", i)]
        ops += [("B", i) for i in range(micro - warm, micro)]
        order.append(ops)
    done: dict[tuple[str, int, int], int] = {}
    free = list(t0)
    out: list[list[tuple[str, int, int]]] = [[] for _ in range(stages)]
    ptr = [0] * stages
    while any(ptr[s] < len(order[s]) for s in range(stages)):
        for s in range(stages):
            while ptr[s] < len(order[s]):
                kind, i = order[s][ptr[s]]
                dep = ("F", s - 1, i) if kind == "F" else ("B", s + 1, i)
                edge = (kind == "F" and s == 0) or (kind == "B" and s == stages - 1)
                if not edge and dep not in done:
                    break
                ready = max(free[s], done[dep] + 20_000 if not edge else 0)
                stop = ready + rng.lognormvariate(0.0, 0.02) * (tf if kind == "F" else 2 * tf)
                done[(kind, s, i)] = free[s] = int(stop)
                out[s].append((kind, ready, int(stop)))
                ptr[s] += 1
    return out


def one_f_one_b(
    steps: int = 40, seed: int = 3, stage: int = 0, stages: int = 4, micro: int = 8
) -> Workload:
    rng = random.Random(seed)
    ring = _Ring(rng)
    layers, h, mb_tokens, tf = 4, 8192, 2048, 4e6
    act = 2 * mb_tokens * h
    buckets = [160 * MIB, 160 * MIB, 160 * MIB, 96 * MIB + 4096]
    last = stage == stages - 1
    w = Workload(f"1F1B stage {stage}/{stages}")
    t = [0] * stages
    for _k in range(steps):
        w.step_starts.append(t[stage])
        every = schedule_1f1b(stages, micro, rng, tf, t)
        ops = every[stage]
        for _, a, b in ops:
            for j in range(2 * layers):
                ring.call(TP, AR, act, a + (b - a) * (2 * j + 1) // (4 * layers))
        c = ops[-1][2]
        if stage in (0, stages - 1):
            c = ring.call(EMB, AR, 4 * 50304 * h // 8, c)
        for b in buckets:
            c = ring.call(DP, RS, b, c)
        if last:
            c = ring.call(DP, AR, 4, c)  # the loss, averaged for logging
        # the gradient norm and the inf check span every stage: the slowest one sets the end
        c = max(c, max(s_ops[-1][2] for s_ops in every) + 1_000_000)
        c = ring.call(MP, AR, 4, c)
        c = ring.call(MP, AR, 4, c)
        c += ring.jit(6e6)  # optimizer
        for b in buckets:
            c = ring.call(DP, AG, b, c)
        c += ring.jit(1e6) + _stall(rng, 2 * micro * 3 * tf)
        t = [c] * stages
    w.per_step[TP] = [(AR, act)] * (micro * 4 * layers)
    w.per_step[DP] = [(RS, b) for b in buckets] + ([(AR, 4)] if last else [])
    w.per_step[DP] += [(AG, b) for b in buckets]
    w.records = ring.records()
    return w


def random_calls(calls: int = 4000, seed: int = 4) -> Workload:
    """No step: sizes drawn at random, random gaps (an evaluation or inference server)."""
    rng = random.Random(seed)
    ring = _Ring(rng)
    t = 0
    for _ in range(calls):
        coll = rng.choice((AG, RS, AR))
        t = ring.call(DP, coll, 1 << rng.randrange(10, 28), t + int(rng.expovariate(1 / 2e6)))
    w = Workload("random sizes")
    w.records = ring.records()
    return w

"""Compile-to-table: a job's state features (+ policy constraints) -> the plugin's table.

For every communicator scale the job will use (the world communicator, for
multi-node jobs the intra-node one, and every group its parallelism degrees
imply: TP, CP, DP, DP×CP, PP, EP; up to `MAX_SCALES` scale classes, the sidecar
tunes any other online, agent/shapes.py), every collective and every log2
size bucket from 8 B to 64 GiB (`BUCKETS`; smaller and larger calls keep
NCCL's own choice), the policy ranks configurations at
the bucket's geometric middle. A cell then holds:

- `choices`: the policy's ranked configurations (up to `MAX_CHOICES`), the
  plugin's fallbacks if NCCL marks one unavailable. When the policy's first
  choice is NCCL's own (algorithm, protocol) with NCCL's channels and chunk,
  `choices` stays empty: NCCL then decides itself, which stays right even if
  the real NCCL version's cost model differs from our re-implementation.
- `candidates` (mode `learned` only): the next most probable configurations
  plus NCCL's own pick, weighted by the policy's probabilities, explored with
  probability `explore` that halves every 2**half_life_log2 calls so the
  expected exploratory calls per cell are at most the policy's `budgetCalls`.
  Where `choices` is empty NCCL's own pick already runs, so it is no
  candidate, and `explore` is scaled by the alternatives' share of the
  policy's probability: a cell the policy is sure of explores little, but
  never not at all (at least 2**-16), so the sidecar's tuner still measures
  it; its weights are relative to the more likely of NCCL's pick and the
  best alternative (the sidecar's tuner gives NCCL's pick WEIGHT_MAX).

Passthrough jobs (in-network aggregation active, a library other than NCCL)
and modes `off` / `observe` compile to a table without cells: NCCL's own
choice everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    MAX_CANDIDATES,
    MAX_CHOICES,
    MAX_SCALES,
    WEIGHT_MAX,
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    scale_class,
)
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import Mode, NCCLTuningPolicySpec
from dynamiccl.policy.runtime.decide import Decider, passthrough
from dynamiccl.policy.runtime.encode import JobContext, job_spec
from dynamiccl.policy.runtime.ranker import Ranker
from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS, ActionLimits
from dynamiccl.policy.sim.system import derive_spec, resolve

INITIAL_EXPLORE: Final = 0.25
MIN_EXPLORE: Final = 2.0**-16  # the plugin's smallest non-zero explore probability
# Size buckets compiled: 8 B .. 64 GiB (buckets 3..35). Calls outside have no
# cell, so NCCL's own choice stands for them.
BUCKETS: Final = range(3, 36)
ALGOS: Final = tuple(Algo)
PROTOS: Final = tuple(Proto)
COLLS: Final = tuple(Collective)


@dataclass(frozen=True)
class Communicator:
    """One communicator shape the job will create."""

    context: JobContext
    scale: int


def _span(size: int, stride: int, local: int) -> tuple[int, int]:
    """(nranks, nnodes) of the group of rank 0 whose `size` members are `stride` ranks apart,
    `local` ranks per node (every group of the same kind has the same shape)."""
    if stride >= local:
        return size, size  # consecutive members are on different nodes
    return size, ((size - 1) * stride) // local + 1


def parallel_groups(f: StateFeatures) -> list[tuple[str, int, int]]:
    """(name, nranks, nnodes) of every communicator the job's parallelism implies.

    Ranks are laid out as Megatron-LM (order tp-cp-ep-dp-pp) and DeepSpeed do: TP
    fastest, then CP, then DP, PP slowest; `local` ranks per node. A DP degree left at 1
    while the other degrees do not fill the world is the rest of the world
    (world / (tp·cp·pp)). The groups: TP, CP, DP, DP×CP (the gradient group when CP
    is used), PP, and EP (consecutive data-parallel ranks), each once it has more than
    one rank and is not the world itself.
    """
    d, local, world = f.workload.degrees, max(f.nproc_per_node, 1), f.world_size
    dp = d.dp
    inner = d.tp * d.cp * d.pp
    if dp == 1 and world % inner == 0:
        dp = world // inner
    kinds = (
        ("tp", d.tp, 1),
        ("cp", d.cp, d.tp),
        ("dp", dp, d.tp * d.cp),
        ("dp-cp", dp * d.cp if d.cp > 1 and dp > 1 else 1, d.tp),
        ("pp", d.pp, d.tp * d.cp * dp),
        ("ep", d.ep, d.tp * d.cp),
    )
    out = [("world", world, f.topology.nodes)]
    for name, size, stride in kinds:
        if 1 < size < world:
            out.append((name, *_span(size, stride, local)))
    return out


def shape_spec(spec: TopologySpec, nranks: int, nnodes: int) -> TopologySpec:
    """The topology a communicator of `nranks` ranks over `nnodes` nodes of the job runs on:
    `nnodes` of the job's nodes with `nranks / nnodes` GPUs each (at least one)."""
    per_node = max(1, nranks // max(nnodes, 1))
    return derive_spec(spec, nodes=nnodes, gpus_per_node=per_node, container_gpus=per_node)


def communicators(job: TopologySpec | StateFeatures) -> list[Communicator]:
    """World communicator first, then intra-node ones, then the other groups the
    parallelism degrees imply (`parallel_groups`; dedup by scale class, <= MAX_SCALES)."""
    world = JobContext.of(job)
    out = [Communicator(world, scale_class(world.system.ranks, world.system.nodes))]
    spec = job_spec(job) if isinstance(job, StateFeatures) else job
    local = world.system.local_ranks
    shapes: list[tuple[int, int]] = []
    if world.system.nodes > 1 and local > 1:
        shapes.append((local, 1))
    if isinstance(job, StateFeatures):
        shapes += [(n, k) for _, n, k in parallel_groups(job)[1:] if (n, k) != (local, 1)]
    for g, nodes in shapes:
        ctx = JobContext(resolve(shape_spec(spec, g, nodes)), None)
        sc = scale_class(g, nodes)
        if sc not in {c.scale for c in out} and len(out) < MAX_SCALES:
            out.append(Communicator(ctx, sc))
    return out


def coverage(job: StateFeatures) -> list[tuple[str, int, int, int, bool]]:
    """(group, nranks, nnodes, scale class, has table cells) of each communicator the job's
    parallelism implies: what `communicators` compiles, and what it leaves to NCCL."""
    compiled = {c.scale for c in communicators(job)}
    return [
        (name, n, k, scale_class(n, k), scale_class(n, k) in compiled)
        for name, n, k in parallel_groups(job)
    ]


def half_life_log2(budget_calls: int, explore: float = INITIAL_EXPLORE) -> int:
    """Half-life so that sum_j explore * 2**-(j >> h) ~= budget_calls."""
    if budget_calls <= 0:
        return 0
    return max(0, min(63, round(math.log2(max(budget_calls / (2.0 * explore), 1.0)))))


@lru_cache(maxsize=4096)
def _choice(act: tuple[int, ...]) -> Choice:
    # Head indices come from fixed, valid option tables: skip re-validation (speed).
    return Choice.model_construct(
        algo=ALGOS[act[0]],
        proto=PROTOS[act[1]],
        nchannels=CHANNEL_OPTIONS[act[2]],
        chunk_bytes=CHUNK_OPTIONS[act[3]],
    )


_CANDIDATES: dict[tuple[tuple[int, ...], int], Candidate] = {}


def _candidate(act: tuple[int, ...], weight: int) -> Candidate:
    key = (act, weight)
    cand = _CANDIDATES.get(key)
    if cand is None:
        cand = Candidate.model_construct(**dict(_choice(act)), weight=weight)
        if len(_CANDIDATES) < 65536:
            _CANDIDATES[key] = cand
    return cand


def _step_weight(q: int) -> int:
    w = round(WEIGHT_MAX * math.pow(2.0, q / 8))
    return max(1, min(WEIGHT_MAX, w))


# _step_weight(-i) for every step a weight can take (ratios 1 .. 1/WEIGHT_MAX)
_STEP_WEIGHTS: Final = tuple(_step_weight(-i) for i in range(round(8 * math.log2(WEIGHT_MAX)) + 1))


def _weight(p: float, top: float) -> int:
    """Relative weight on a log scale with 1/8 octave steps (few distinct values)."""
    q = round(8 * math.log2(max(p / top, 1.0 / WEIGHT_MAX)))
    return _STEP_WEIGHTS[-q] if -len(_STEP_WEIGHTS) < q <= 0 else _step_weight(q)


def compile_table(
    policy: Ranker,
    job: TopologySpec | StateFeatures,
    spec: NCCLTuningPolicySpec | None = None,
    *,
    version: int = 1,
    buckets: range = BUCKETS,
) -> DecisionTable:
    """The initial decision table of a job."""
    pol = spec or NCCLTuningPolicySpec()
    limits = ActionLimits.from_policy(pol)
    features = job if isinstance(job, StateFeatures) else None
    comms = communicators(job)
    scales = tuple(c.scale for c in comms)
    learned = pol.mode is Mode.LEARNED
    explore = ExploreSchedule(
        seed=pol.exploration.seed,
        half_life_log2=half_life_log2(pol.exploration.budget_calls) if learned else None,
    )
    if passthrough(features) is not None or pol.mode in (Mode.OFF, Mode.OBSERVE):
        return DecisionTable(version=version, scales=scales, explore=explore)
    n_cand = min(MAX_CANDIDATES, pol.exploration.max_candidates) if learned else 0
    b = np.array(list(buckets), dtype=np.int64)
    colls = np.repeat(np.arange(len(Collective)), len(b))
    sizes = np.tile(2.0 ** (b + 0.5), len(Collective))
    obs, feas, picks = [], [], []
    for comm in comms:
        o, f, p = Decider(policy, comm.context, limits).inputs(colls, sizes)
        obs.append(o)
        feas.append(f)
        picks.append(p)
    all_picks = np.concatenate(picks)
    acts, probs = policy.top_actions(
        np.concatenate(obs), np.concatenate(feas), MAX_CHOICES + n_cand, all_picks
    )
    act_list = acts.tolist()
    prob_list = probs.tolist()
    pick_list = all_picks.tolist()
    cells: list[Cell] = []
    n = len(colls)
    for j, comm in enumerate(comms):
        for i in range(n):
            r = j * n + i
            cell = _cell(
                COLLS[colls[i]],
                int(b[i % len(b)]),
                comm.scale,
                act_list[r],
                prob_list[r],
                pick_list[r],
                n_cand,
            )
            if cell is not None:
                cells.append(cell)
    return DecisionTable(version=version, scales=scales, cells=tuple(cells), explore=explore)


def _cell(  # noqa: PLR0917 - one cell's coordinates and content
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
    return Cell.model_construct(
        collective=coll,
        bucket=bucket,
        scale=scale,
        choices=tuple(_choice(k) for k in ranked),
        candidates=tuple(_candidate(k, _weight(p, top)) for k, p in cands),
        explore=explore if cands else 0.0,
    )

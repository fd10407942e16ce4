"""Compile-to-table: a job's state features (+ policy constraints) -> the plugin's table.

For every communicator scale the job will use (the world communicator, for
multi-node jobs the intra-node one, and every group its parallelism degrees
imply: TP, CP, DP, DP×CP, PP, EP; up to `MAX_SCALES` scale classes, the sidecar
tunes any other online, sidecar/shapes.py), every collective and every log2
size bucket from 8 B to 64 GiB (`BUCKETS`; smaller and larger calls keep
NCCL's own choice), the policy ranks configurations at
the bucket's geometric middle. A cell then holds:

- `choices`: the policy's ranked configurations (up to `MAX_CHOICES`), the
  plugin's fallbacks if NCCL marks one unavailable. When the policy's first
  choice is NCCL's own (algorithm, protocol) with NCCL's channels and chunk,
  `choices` stays empty: NCCL then decides itself, which stays right even if
  the real NCCL version's cost model differs from our re-implementation.
- `candidates` (mode `learned`): the next most probable configurations
  plus NCCL's own pick, weighted by the policy's probabilities, explored with
  probability `explore` that halves every 2**half_life_log2 calls so the
  expected exploratory calls per cell are at most the policy's `budgetCalls`.
  Where `choices` is empty NCCL's own pick already runs, so it is no
  candidate, and `explore` is scaled by the alternatives' share of the
  policy's probability: a cell the policy is sure of explores little, but
  never not at all (at least 2**-16), so the sidecar's tuner still measures
  it; its weights are relative to the more likely of NCCL's pick and the
  best alternative (the sidecar's tuner gives NCCL's pick WEIGHT_MAX).

In mode `static` a cell's one candidate is NCCL's own pick, the guardrail's
comparison arm (comparison.py), so the sidecar can revert a choice slower than NCCL's.

Passthrough jobs (in-network aggregation active, a library other than NCCL)
and modes `off` / `observe` compile to a table without cells: NCCL's own
choice everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Collective
from dynamiccl.api.table import (
    MAX_CANDIDATES,
    MAX_CHOICES,
    MAX_SCALES,
    DecisionTable,
    ExploreSchedule,
    scale_class,
)
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import Mode, NCCLTuningPolicySpec
from dynamiccl.policy.runtime.cells import ALGOS, COLLS, PROTOS
from dynamiccl.policy.runtime.cells import INITIAL_EXPLORE as INITIAL_EXPLORE  # noqa: PLC0414 - re-export
from dynamiccl.policy.runtime.cells import MIN_EXPLORE as MIN_EXPLORE  # noqa: PLC0414 - re-export
from dynamiccl.policy.runtime.cells import cells as table_cells
from dynamiccl.policy.runtime.comparison import compare_half_life, comparison_cells
from dynamiccl.policy.runtime.decide import Decider, passthrough, stacked_inputs
from dynamiccl.policy.runtime.encode import JobContext, job_spec
from dynamiccl.policy.runtime.ranker import Ranker
from dynamiccl.policy.runtime.space import ActionLimits
from dynamiccl.policy.sim.system import derive_spec, resolve

# Size buckets compiled: 8 B .. 64 GiB (buckets 3..35). Calls outside have no
# cell, so NCCL's own choice stands for them.
BUCKETS: Final = range(3, 36)
# The communicator shapes the shipped model was trained on (policy/train/curriculum.py:
# up to 128 nodes, up to 8 ranks per node). A communicator past them gets no compiled
# cells: NCCL's own choice, and the sidecar tunes it online like any shape the table does
# not carry (sidecar/shapes.py), in its own scale class.
MODEL_MAX_NODES: Final = 128
MODEL_MAX_LOCAL_RANKS: Final = 8


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


def trained_shape(nranks: int, nnodes: int) -> bool:
    """Is a communicator of this shape within what the model was trained on?"""
    nnodes = max(nnodes, 1)
    return nnodes <= MODEL_MAX_NODES and max(nranks // nnodes, 1) <= MODEL_MAX_LOCAL_RANKS


def communicators(job: TopologySpec | StateFeatures) -> list[Communicator]:
    """World communicator first, then intra-node ones, then the other groups the
    parallelism degrees imply (`parallel_groups`; dedup by scale class, <= MAX_SCALES),
    each only if its shape is one the model was trained on (`trained_shape`)."""
    world = JobContext.of(job)
    out: list[Communicator] = []
    if trained_shape(world.system.ranks, world.system.nodes):
        out.append(Communicator(world, scale_class(world.system.ranks, world.system.nodes)))
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
        if sc not in {c.scale for c in out} and len(out) < MAX_SCALES and trained_shape(g, nodes):
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
    half_life: int | None = None
    if learned:
        half_life = half_life_log2(pol.exploration.budget_calls)
    elif pol.mode is Mode.STATIC:  # the guardrail's comparison arm decays (comparison.py)
        half_life = compare_half_life(pol.guardrails.min_samples)
    explore = ExploreSchedule(seed=pol.exploration.seed, half_life_log2=half_life)
    if passthrough(features) is not None or pol.mode in (Mode.OFF, Mode.OBSERVE) or not comms:
        return DecisionTable(version=version, scales=scales, explore=explore)
    n_cand = min(MAX_CANDIDATES, pol.exploration.max_candidates) if learned else 0
    b = np.array(list(buckets), dtype=np.int64)
    colls = np.repeat(np.arange(len(Collective)), len(b))
    sizes = np.tile(2.0 ** (b + 0.5), len(Collective))
    deciders = [Decider(policy, comm.context, limits) for comm in comms]
    obs, feasible, all_picks = stacked_inputs(deciders, colls, sizes)
    acts, probs = policy.top_actions(obs, feasible, MAX_CHOICES + n_cand, all_picks)
    rows = (  # collective, bucket and scale class of each row
        np.tile(colls, len(comms)),
        np.tile(b, len(Collective) * len(comms)),
        np.repeat(np.array(scales, dtype=np.int64), len(colls)),
    )
    cells = table_cells(acts, probs, all_picks, rows, n_cand)
    if pol.mode is Mode.STATIC:
        coords = zip(*(r.tolist() for r in rows), all_picks.tolist(), strict=True)
        picks = {(COLLS[c], k, s): (ALGOS[a], PROTOS[p]) for c, k, s, (a, p) in coords}
        cells = comparison_cells(cells, picks)
    return DecisionTable(version=version, scales=scales, cells=tuple(cells), explore=explore)

"""State features -> the policy network's observation vectors.

An observation is a static part (the job: topology block, workload block,
environment) and a per-call part (collective, size, and NCCL's own view of
the call). NCCL's view is what its cost model (`nccl_model.NcclModel`, our
re-implementation of `src/graph/tuning.cc`) predicts for every (algorithm,
protocol): its pick, each alternative's estimated time relative to the pick,
and each estimate's latency and transfer terms. It is a deterministic
function of the topology and the call, so it adds no information the state
features do not hold, but it lets the network learn "where does reality
depart from NCCL's model" instead of re-deriving NCCL's model from scratch.

Every numeric feature is scaled to roughly [0, 1]. `OBS_DIM` is the vector
length; `OBS_VERSION` changes whenever the layout does (models store it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dynamiccl.api.features import (
    Parallelism,
    StateFeatures,
    SyncMode,
    Tier,
    TierMix,
    WorkloadFeatures,
)
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import Fabric, Intra, TopologySpec
from dynamiccl.policy.runtime.actions import collnet_supported, nvls_supported
from dynamiccl.policy.sim.hardware import Arch
from dynamiccl.policy.sim.nccl_model import NcclModel
from dynamiccl.policy.sim.system import System, resolve

OBS_VERSION: Final = 3
F32 = NDArray[np.float32]
F64 = NDArray[np.float64]
_LOCAL_CLASSES: Final = (1, 2, 3, 4, 5, 6, 7, 8, 9)  # ranks per NCCL node; 9 = more than 8
_NODE_CLASSES: Final = (1, 2, 4, 8, 16, 64, 1 << 30)  # NCCL nodes: 1, 2, 3-4, ..., > 64
_REL_CLIP: Final = 4.0  # log-ratio cap for NCCL's relative estimates (e^4 ~ 55x)


def _onehot(i: int, n: int) -> list[float]:
    out = [0.0] * n
    out[i] = 1.0
    return out


def _log2(x: float, scale: float) -> float:
    return math.log2(max(x, 1.0)) / scale


def job_spec(features: StateFeatures) -> TopologySpec:
    """The topology spec a job's communicator runs on, from its state features.

    A container boundary (a pod holds fewer GPUs than its node) becomes the
    spec's `container_gpus` extra key, which the simulator and NCCL model
    understand (`system.resolve`).
    """
    spec = features.topology.spec()
    env = features.environment
    per_pod = features.gpus_per_pod
    if (
        env.container_boundary
        and 0 < per_pod < spec.gpus_per_node
        and spec.gpus_per_node % per_pod == 0
    ):
        return TopologySpec.model_validate({**spec.model_dump(), "container_gpus": per_pod})
    return spec


@dataclass(frozen=True)
class JobContext:
    """What the encoder needs about one job: its resolved system and (optional) features."""

    system: System
    features: StateFeatures | None = None

    @classmethod
    def of(cls, spec_or_features: TopologySpec | StateFeatures) -> JobContext:
        """From a topology spec (policy decide without --job) or full state features."""
        if isinstance(spec_or_features, StateFeatures):
            return cls(resolve(job_spec(spec_or_features)), spec_or_features)
        return cls(resolve(spec_or_features), None)


def _tiers(ctx: JobContext) -> tuple[Tier, TierMix, bool]:
    if ctx.features is not None:
        t = ctx.features.topology
        return t.tier_max, t.tier_mix, t.ina_active
    if ctx.system.spec.nodes == 1:
        return Tier.SAME_NODE, TierMix(), False
    # Without a job we only know the nodes share a fabric: assume one leaf switch.
    return Tier.SAME_RACK, TierMix(same_node=0.0, same_rack=1.0), False


def static_vector(ctx: JobContext) -> F32:
    """The per-job part of the observation."""
    s = ctx.system
    spec = s.spec
    f: list[float] = []
    f += _onehot(int(s.gpu.arch), len(Arch))
    f.append(s.gpu.compute_capability / 100.0)
    f += [
        _log2(spec.gpus_per_node, 6),
        _log2(spec.nodes, 10),
        _log2(s.ranks, 14),
        _log2(s.local_ranks, 6),
        _log2(s.nodes, 10),
    ]
    # Exact team sizes matter (NVLS gains depend on 5 vs 6 GPUs; NCCL's own
    # tables switch at 1 / 2 / >= 4 nodes): one-hots next to the log scales.
    f += _onehot(min(s.local_ranks, len(_LOCAL_CLASSES)) - 1, len(_LOCAL_CLASSES))
    f += _onehot(
        next(i for i, top in enumerate(_NODE_CLASSES) if s.nodes <= top), len(_NODE_CLASSES)
    )
    f += _onehot(list(Intra).index(spec.intra), len(Intra))
    f += [spec.nvlink_GBps / 1000.0, float(spec.nvls), float(nvls_supported(s))]
    f.append(spec.pcie_gen / 6.0)
    f += [s.nics / 8.0, spec.nic_Gbps / 800.0, s.net_node_GBps / 400.0]
    f += _onehot(list(Fabric).index(spec.fabric), len(Fabric))
    f += [float(spec.sharp), float(collnet_supported(s))]
    f += [float(s.container_split), _log2(s.containers_per_node, 3)]
    tier_max, mix, ina = _tiers(ctx)
    f += _onehot(tier_max.level, len(Tier))
    f += [mix.same_node, mix.same_rack, mix.cross_rack, mix.cross_zone, float(ina)]
    w = ctx.features.workload if ctx.features is not None else WorkloadFeatures()
    f += _onehot(list(Parallelism).index(w.parallelism), len(Parallelism))
    d = w.degrees
    f += [_log2(d.dp, 10), _log2(d.tp, 10), _log2(d.pp, 10), _log2(d.ep, 10)]
    f += _onehot(list(SyncMode).index(w.sync_mode), len(SyncMode))
    f += [w.compression_ratio, math.log10(w.model_params + 1.0) / 12.0]
    c2c = w.c2c_ratio
    f += [math.log1p(c2c) / 5.0 if c2c is not None else 0.0, float(c2c is not None)]
    return np.asarray(f, dtype=np.float32)


STATIC_DIM: Final = 4 + 1 + 5 + 9 + 7 + 3 + 3 + 1 + 3 + 5 + 2 + 2 + 4 + 5 + 6 + 4 + 4 + 2 + 2
N_AP: Final = len(Algo) * len(Proto)
CALL_DIM: Final = len(Collective) + 2 + len(Algo) + len(Proto) + 4 * N_AP + 1
OBS_DIM: Final = STATIC_DIM + CALL_DIM
# Offsets of NCCL's own pick (one-hot algo, then proto) in the observation.
PICK_ALGO_OFFSET: Final = STATIC_DIM + len(Collective) + 2
PICK_PROTO_OFFSET: Final = PICK_ALGO_OFFSET + len(Algo)


@dataclass(frozen=True)
class CallView:
    """NCCL's view of a batch of calls (from its cost model)."""

    pick_algo: NDArray[np.int64]
    pick_proto: NDArray[np.int64]
    estimate_us: NDArray[np.float64]  # NCCL's estimate of its pick
    rel: NDArray[np.float64]  # [n, A, P] log(estimate / pick estimate), inf = unavailable
    latency_us: NDArray[np.float64]  # [n, A, P] NCCL's size-independent part (inf: unavailable)
    transfer_us: NDArray[np.float64]  # [n, A, P] NCCL's size-dependent part


def nccl_view(nccl: NcclModel, coll: ArrayLike, nbytes: ArrayLike) -> CallView:
    """NCCL's estimates for every (algorithm, protocol) of each call, and its pick."""
    return view_of(*nccl_times(nccl, coll, nbytes))


def nccl_times(
    nccl: NcclModel, coll: ArrayLike, nbytes: ArrayLike, latency: F64 | None = None
) -> tuple[F64, F64]:
    """NCCL's estimates [n, A, P] of each call and their size-independent parts (from
    `latency`, `nccl_latency`'s table, when given)."""
    c = np.asarray(coll, dtype=np.int64).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = nccl.times(c, nbytes)  # [n, A, P]
    return t, (nccl_latency(nccl) if latency is None else latency)[c]


def nccl_latency(nccl: NcclModel) -> F64:
    """NCCL's estimate of a 0-byte call [collective, A, P]: its size-independent part."""
    kinds = np.arange(len(Collective))
    with np.errstate(divide="ignore", invalid="ignore"):
        out: F64 = nccl.times(kinds, np.zeros(kinds.shape))
    return out


def view_of(t: F64, lat: F64) -> CallView:
    """The view from `nccl_times`' estimates (of any calls of any communicators)."""
    flat = t.reshape(t.shape[0], -1)
    best = np.argmin(flat, axis=1)
    est = flat[np.arange(flat.shape[0]), best]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.log(t / np.maximum(est, 1e-9)[:, None, None])
        transfer = np.where(np.isfinite(t), np.maximum(t - lat, 0.0), np.inf)
    return CallView(best // len(Proto), best % len(Proto), est, rel, lat, transfer)


def call_obs(
    static: F32, view: CallView, coll: ArrayLike, nbytes: ArrayLike, ranks: int | NDArray[np.int64]
) -> F32:
    """Observation rows [n, OBS_DIM] for a batch of calls of one communicator (`static`
    [STATIC_DIM], `ranks` an int), or of several (per row: `static` [n, STATIC_DIM], `ranks`)."""
    c = np.asarray(coll, dtype=np.int64).reshape(-1)
    b = np.asarray(nbytes, dtype=np.float64).reshape(-1)
    n = c.size
    out = np.zeros((n, OBS_DIM), dtype=np.float32)
    out[:, :STATIC_DIM] = static
    i = STATIC_DIM
    out[np.arange(n), i + c] = 1.0
    i += len(Collective)
    out[:, i] = np.log2(np.maximum(b, 1.0)) / 34.0
    out[:, i + 1] = np.log2(np.maximum(b / np.maximum(ranks, 1), 1.0)) / 34.0
    i += 2
    out[np.arange(n), i + view.pick_algo] = 1.0
    i += len(Algo)
    out[np.arange(n), i + view.pick_proto] = 1.0
    i += len(Proto)
    rel = view.rel.reshape(n, N_AP)
    ok = np.isfinite(rel)
    out[:, i : i + N_AP] = np.where(ok, np.clip(rel, 0.0, _REL_CLIP) / _REL_CLIP, 1.0)
    i += N_AP
    out[:, i : i + N_AP] = ok
    i += N_AP
    # NCCL's latency and transfer terms separately (log10 us): a departure that
    # scales one protocol's bandwidth is then a shift of one input.
    for part, scale in ((view.latency_us, 3.0), (view.transfer_us, 7.0)):
        v = part.reshape(n, N_AP)
        out[:, i : i + N_AP] = np.where(ok, np.log10(np.maximum(v, 1e-3)) / scale, 0.0)
        i += N_AP
    out[:, i] = np.log10(np.maximum(view.estimate_us, 1e-3)) / 6.0
    return out


def encode_calls(
    ctx: JobContext, nccl: NcclModel, coll: ArrayLike, nbytes: ArrayLike
) -> tuple[F32, CallView]:
    """Observations and NCCL's view for a batch of calls of one job."""
    view = nccl_view(nccl, coll, nbytes)
    return call_obs(static_vector(ctx), view, coll, nbytes, ctx.system.ranks), view

"""NCCL's own cost model (NCCL 2.27), re-implemented: which configuration NCCL picks.

For every (collective, algorithm, protocol) NCCL precomputes a latency (us) and
an algorithm bandwidth (GB/s) at communicator init (`ncclTopoTuneModel`,
NVIDIA/nccl `src/graph/tuning.cc`), estimates each call as

    time = lat * latCount + nBytes / (1000 * bw)        (ncclTopoGetAlgoTime)

with a tree correction factor for medium sizes and a ring "plateau" latency
factor, and takes the minimum (`topoGetAlgoInfo`, `src/enqueue.cc`). The
channel count is then reduced for small messages until every thread has
`threadThreshold` bytes of work. This module is our code, written from those
facts; comments cite the function each piece mirrors. `numPipeOps` is 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.runtime.actions import COLLECTIVES, nccl_available
from dynamiccl.policy.sim import nccl_tables as tables
from dynamiccl.policy.sim.hardware import Arch
from dynamiccl.policy.sim.nccl_graph import Graph, Graphs, derive_graphs
from dynamiccl.policy.sim.system import System

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

_TREE, _RING, _CND, _CNC, _NVLS, _NVLST, _PAT = (a.nccl_id for a in Algo)
_LL, _LL128, _SIMPLE = (p.nccl_id for p in Proto)
_BC, _RED, _AG, _RS, _AR = (c.nccl_id for c in Collective)


@dataclass(frozen=True)
class _Ctx:
    """Per-collective constants of `ncclTopoTuneModel`'s loop."""

    arch: int
    ll_max: float  # llMaxBw
    idx2: int  # node bucket: 1, 2, >= 4 nodes
    ppn: float
    nsteps: int
    net_overhead: float


@dataclass(frozen=True)
class NcclChoice:
    """NCCL's own decision for one call."""

    algo: Algo
    proto: Proto
    nchannels: int
    time_us: float  # NCCL's estimate, not the simulated time


def _log2i(x: int) -> int:
    return x.bit_length() - 1 if x > 0 else -1


class NcclModel:
    """NCCL's cost tables for one system; vectorised estimates and picks."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.graphs: Graphs = derive_graphs(system)
        self.lat = np.zeros((len(COLLECTIVES), len(Algo), len(Proto)))
        self.bw = np.zeros((len(COLLECTIVES), len(Algo), len(Proto)))
        self.lat_terms = np.zeros((len(COLLECTIVES), len(Algo), len(Proto), 3))
        self._tune()

    # -- ncclTopoTuneModel -------------------------------------------------
    def _graph(self, a: int) -> Graph | None:
        g = self.graphs
        if a in (_NVLS, _NVLST):
            return g.nvls
        if a in (_CND, _CNC):
            return g.collnet
        return g.tree if a == _TREE else g.ring

    def _tune(self) -> None:
        s = self.system
        arch = int(s.gpu.arch)
        n_nodes, n_ranks = s.nodes, s.ranks
        if n_ranks <= 1:
            return
        idx2 = n_nodes - 1 if n_nodes <= 2 else 2
        idx1 = arch if n_nodes == 1 else (1 if s.cpu_vendor == "amd" else 0)
        ll_max = tables.LL_MAX_BW[idx1, idx2]
        ppn = n_ranks / n_nodes
        net_overhead = 2.0 if s.cpu_vendor == "amd" else 1.0  # getNetOverhead
        for coll in COLLECTIVES:
            c = coll.nccl_id
            avail = nccl_available(s, coll)
            nsteps = 2 * (n_ranks - 1) if c == _AR else n_ranks - 1 if c in (_AG, _RS) else n_ranks
            for a in range(len(Algo)):
                graph = self._graph(a)
                if graph is None:
                    continue
                for p in range(len(Proto)):
                    if not avail[a, p]:
                        continue
                    ctx = _Ctx(arch, ll_max, idx2, ppn, nsteps, net_overhead)
                    bw = self._bus_bw(c, a, p, graph, ctx)
                    if not bw > 0:
                        continue
                    if not (a != _RING and c in (_AG, _RS)):
                        ratio = n_ranks / nsteps if a in (_RING, _NVLS, _NVLST) else 0.5
                        bw *= ratio
                    self.bw[c, a, p] = bw
                    terms = self._latency(c, a, p, graph, ctx)
                    self.lat_terms[c, a, p] = terms
                    self.lat[c, a, p] = sum(terms)

    def _bus_bw(self, c: int, a: int, p: int, g: Graph, ctx: _Ctx) -> float:
        arch, ll_max, idx2, ppn = ctx.arch, ctx.ll_max, ctx.idx2, ctx.ppn
        n_nodes = self.system.nodes
        collnet = a in (_CND, _CNC)
        bw = g.bw_intra if (n_nodes <= 2 or collnet) else g.bw_inter
        if a in (_NVLS, _NVLST):
            if g.n_channels < 2:
                return 0.0
            intra = g.bw_intra * tables.NVLS_EFFICIENCY[arch] * (g.n_channels - 1) / g.n_channels
            intra *= 2.0 if c == _AR else (ppn - 1) / ppn  # AllReduce pipelines two ops
            inter = g.bw_inter * (2.0 if (n_nodes <= 2 and a == _NVLST) else 1.0)
            cap = tables.PER_CH_MAX_NVLS_TREE[arch, idx2] if a == _NVLST else math.inf
            bw = min(intra, inter, cap)
        bus = g.n_channels * bw
        if a == _RING and p == _LL:
            bus = min(ll_max, bus * 0.5)
        if a == _RING and p == _LL128:
            bus = min(bus * 0.92, g.n_channels * tables.PER_CH_MAX_RING_LL128[arch, idx2])
        if a == _TREE and c == _AR:
            bus = min(bus * 0.92, g.n_channels * tables.PER_CH_MAX_TREE[arch, idx2])
        if a == _TREE and p == _LL:
            bus = min(bus / 3.8, ll_max)
        if a == _TREE and p == _LL128:
            factor = 7.0 / 9.0 if n_nodes == 1 else 120.0 / 128.0
            bus = min(bus * factor, g.n_channels * tables.PER_CH_MAX_TREE_LL128[arch, idx2])
        if a == _TREE and g.tree_pattern:
            bus *= 0.85
        if a == _PAT:
            bus *= 0.75
        if a == _CND:
            if c in (_AG, _RS):
                bus = ppn * min(g.bw_intra, g.bw_inter * 0.9)
            else:  # CollNet Direct needs a local NIC per GPU for full speed
                factor = ppn / g.n_channels
                factor -= (factor - 1) / 2
                bus /= factor
                if arch >= Arch.HOPPER:
                    bus *= 0.85
        return bus

    def _latency(self, c: int, a: int, p: int, g: Graph, ctx: _Ctx) -> tuple[float, float, float]:
        """(base, intra-node hops, inter-node hops) latency terms; NCCL adds them up."""
        nsteps, ppn, net_overhead = ctx.nsteps, ctx.ppn, ctx.net_overhead
        s = self.system
        n_nodes, n_ranks = s.nodes, s.ranks
        intra_hw = tables.HW_NVLINK if g.nvlink else tables.HW_PCI
        hw = intra_hw if n_nodes == 1 else tables.HW_NET
        base = float(tables.BASE_LAT[a, p])
        intra = float(tables.HW_LAT[intra_hw, a, p])
        # With one rank per node latencies are fully exposed: Tree's network latency.
        inter = float(tables.HW_LAT[tables.HW_NET, _TREE if ppn == 1 else a, p])
        local = n_ranks // n_nodes
        multi = n_nodes > 1
        if a == _RING:
            if c in (_RED, _BC):
                step = float(tables.HW_LAT[hw, a, p])
                if not multi:  # symmetric single-node graphs report sameChannels 1
                    return base, step, 0.0
                # sameChannels 0: per-step chunk latency ("waiting for proper chunk modeling")
                step = float(tables.HW_LAT[hw, _TREE if p == _SIMPLE else a, p])
                return base, 0.0, nsteps * step
            overhead = (net_overhead * (3 if p == _SIMPLE else 1)) if multi else 0.0
            intra = max(intra, overhead)
            inter_steps = 0 if not multi else (2 * (n_nodes - 1) if c == _AR else n_nodes - 1)
            return base, (nsteps - inter_steps) * intra, inter_steps * inter
        if a == _TREE:
            if c != _AR:
                return base, 0.0, 0.0
            return base, 2 * (local - 1) * intra, 2 * _log2i(n_nodes) * inter
        if a == _CND:
            return base, 2 * (min(1, local - 1) * intra + (local - 1) * 0.4), inter
        if a == _CNC:
            return base, 2 * (local - 1) * intra, inter
        if a == _NVLS:  # NVLS replaces the base latency by the NVLink one
            return 0.0, intra, inter if multi else 0.0
        if a == _NVLST:
            return base, intra, 2 * _log2i(n_nodes) * inter
        # PAT (allgather / reducescatter)
        return base, float(n_ranks) * 2.8, _log2i(n_nodes) * (inter / 3.5)

    # -- ncclTopoGetAlgoTime, vectorised ----------------------------------
    def times(self, coll: ArrayLike, nbytes: ArrayLike) -> F64:
        """NCCL's estimate (us) for every (algo, proto): shape (n, 7, 3); inf = unavailable."""
        c = np.asarray(coll, dtype=np.int64).reshape(-1)
        b = np.asarray(nbytes, dtype=np.float64).reshape(-1)
        c, b = np.broadcast_arrays(c, b)
        bw = self.bw[c].copy()  # (n, 7, 3)
        lat = self.lat[c].copy()
        shifted = np.floor(b / 64.0)
        log_size = np.where(shifted >= 1, np.floor(np.log2(np.maximum(shifted, 1.0))), -1).astype(
            np.int64
        )
        ok = (c == _AR) & (log_size >= 0) & (log_size < tables.TREE_CORRECTION_SIZES)
        idx = np.clip(log_size, 0, tables.TREE_CORRECTION.shape[1] - 1)
        corr = tables.TREE_CORRECTION[:, idx].T  # (n, 3)
        bw[:, _TREE, :] *= np.where(ok[:, None], corr, 1.0)
        s = self.system
        if s.gpu.arch >= Arch.BLACKWELL and s.cpu_vendor != "arm":
            bw[:, _NVLST, :] *= np.where(ok[:, None], corr, 1.0)
        if s.nodes > 1:
            plateau = (c == _AR) & (b / (self.graphs.comm_channels * s.ranks) >= 64)
            factor = 1.9 if s.gpu.compute_capability < 80 else 1.4
            lat[:, _RING, _SIMPLE] *= np.where(plateau, factor, 1.0)
        with np.errstate(divide="ignore"):
            t = lat + b[:, None, None] / (1000.0 * bw)
        t[bw <= 0] = np.inf
        if s.ranks <= 1:
            t[:] = np.inf
            t[:, _RING, _SIMPLE] = 0.0
        return t

    def pick(self, coll: ArrayLike, nbytes: ArrayLike) -> tuple[I64, I64, F64]:
        """NCCL's (algo, proto) indices and estimated time for each call."""
        t = self.times(coll, nbytes)
        flat = t.reshape(t.shape[0], -1)
        best = np.argmin(flat, axis=1)
        return best // len(Proto), best % len(Proto), flat[np.arange(flat.shape[0]), best]

    # -- channel tuning in topoGetAlgoInfo ---------------------------------
    @cached_property
    def _work_per_channel(self) -> F64:
        """nThreads * threadThreshold per (algo, proto): bytes a channel must have."""
        g = self.graphs
        simple_ring = 256 if g.ring.bw_intra * g.ring.n_channels <= tables.PCI_BW else 512
        threads = np.full((len(Algo), len(Proto)), float(tables.SIMPLE_MAX_NTHREADS))
        threads[:, _LL] = tables.LL_MAX_NTHREADS
        threads[:, _LL128] = tables.LL128_MAX_NTHREADS
        threads[_RING, _SIMPLE] = simple_ring
        threads[(_CND, _CNC, _NVLS, _NVLST), _SIMPLE] = tables.MAX_NTHREADS
        thr = np.empty((len(Algo), len(Proto)))
        thr[:, _LL] = tables.LL_THREAD_THRESHOLD
        thr[:, _LL128] = tables.LL128_THREAD_THRESHOLD
        thr[:, _SIMPLE] = tables.SIMPLE_THREAD_THRESHOLD
        thr[_RING, _LL] *= self.system.ranks
        thr[(_CND, _CNC), _SIMPLE] = 512
        out: F64 = threads * thr
        return out

    def max_channels(self, algo: ArrayLike) -> I64:
        """The channels NCCL starts from for an algorithm (comm / NVLS channels)."""
        a = np.asarray(algo, dtype=np.int64)
        nvls = (a == _NVLS) | (a == _NVLST)
        out: I64 = np.where(nvls, self.graphs.nvls_channels, self.graphs.comm_channels)
        return out

    def channels(self, algo: ArrayLike, proto: ArrayLike, nbytes: ArrayLike) -> I64:
        """NCCL's channel count for a call: fewer channels until each has enough work."""
        a = np.asarray(algo, dtype=np.int64)
        p = np.asarray(proto, dtype=np.int64)
        b = np.asarray(nbytes, dtype=np.float64)
        nc0 = self.max_channels(a)
        need = self._work_per_channel[a, p]
        fit = np.floor(b / need).astype(np.int64)
        nc = np.clip(fit, 1, nc0)
        nvls = (a == _NVLS) | (a == _NVLST)
        out: I64 = np.where(nvls, nc0, nc)
        return out

    def pick_within(
        self, coll: Collective, nbytes: int, algo: Algo | None = None, proto: Proto | None = None
    ) -> tuple[Algo, Proto] | None:
        """NCCL's pick with NCCL_ALGO / NCCL_PROTO pinned to `algo` / `proto` (None: free).

        None when nothing available matches (NCCL would fail the call).
        """
        t = self.times([coll.nccl_id], [nbytes])[0]
        keep = np.ones(t.shape, dtype=bool)
        if algo is not None:
            keep[np.arange(len(Algo)) != algo.nccl_id] = False
        if proto is not None:
            keep[:, np.arange(len(Proto)) != proto.nccl_id] = False
        t = np.where(keep, t, np.inf)
        if not np.isfinite(t).any():
            return None
        a, p = divmod(int(np.argmin(t)), len(Proto))
        return list(Algo)[a], list(Proto)[p]

    def choose(self, coll: Collective, nbytes: int) -> NcclChoice:
        """NCCL's decision for one call."""
        a, p, t = self.pick([coll.nccl_id], [nbytes])
        algo, proto = Algo(list(Algo)[int(a[0])]), Proto(list(Proto)[int(p[0])])
        nch = int(self.channels(a, p, [nbytes])[0])
        return NcclChoice(algo=algo, proto=proto, nchannels=nch, time_us=float(t[0]))

"""The simulator's physical model: time of any configuration from links, tiers and protocol.

    time = launch + latency(algo, proto) + bytes / bandwidth(algo, proto, nch) * psi(chunk)
           + fill(chunk)                                                  [NVLS only]

- bandwidth: first principles where we have measurements (Ring on NVLink, PCIe
  and networks; NVLS and NVLS_TREE all-reduce): the physical link bandwidth of
  the limiting tier times a calibrated efficiency, times the protocol ceiling
  (LL 50 %: 8-byte lines carry 4 bytes of data and a flag; LL128 120/128 of
  each 128-byte line; Simple 100 %), capped per channel (one CTA per channel).
  Algorithms without any measurement (Tree, CollNet, PAT, NVLS allgather /
  reducescatter) take NCCL's own bandwidth estimate rescaled by the same factor
  that maps NCCL's Ring/Simple estimate onto the calibrated Ring/Simple physics,
  so where nothing is measured the simulator agrees with NCCL's relative view.
- latency: NCCL's per-hop structure (`ncclTopoTuneModel`) with the intra-node
  and network hop latencies scaled by calibrated factors, plus the measurement
  harness's launch overhead.
- psi / fill: per-chunk overhead of the Simple protocol and the NVLS pipeline
  fill; NVLS's chunk shrinks with the message (`calcCollChunking`, enqueue.cc),
  which produces the slow bandwidth ramp measured on 8x H200 (rows h200-ar-*).

Every parameter and constant is listed in docs/simulator.md with its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property, lru_cache
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import Fabric
from dynamiccl.policy.sim import nccl_tables as tables
from dynamiccl.policy.sim.nccl_model import NcclModel
from dynamiccl.policy.sim.system import System

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

_TREE, _RING, _CND, _CNC, _NVLS, _NVLST, _PAT = (a.nccl_id for a in Algo)
_LL, _LL128, _SIMPLE = (p.nccl_id for p in Proto)
_BC, _RED, _AG, _RS, _AR = (c.nccl_id for c in Collective)

PROTO_CEILING: Final = np.array([0.5, 120.0 / 128.0, 1.0])  # LL, LL128, Simple
SIMPLE_CH_CAP: Final = (40.0, 40.0, 60.0, 90.0)  # first search speed per arch (search.cc)
LL_ARCH_SCALE: Final = (39.0 / 141.0, 87.7 / 141.0, 1.0, 2.0)  # llMaxBws N1 relative to Hopper
ETA_PCIE: Final = 0.8  # no PCIe measurement: prior, see docs/simulator.md
ETA_HOST: Final = 0.5  # host-staged copy across a container boundary: two PCIe crossings
STEP_BYTES: Final = 512 * 1024  # Simple step: DEFAULT_BUFFSIZE 4 MiB / NCCL_STEPS 8


class Harness(StrEnum):
    """How a measurement was taken: its per-call launch overhead differs."""

    NCCL_TESTS = "nccl-tests"  # nccl-tests, stream launches
    NCCL_TESTS_GRAPH = "nccl-tests-graph"  # nccl-tests -G 1 (CUDA graph launches)
    TORCH = "torch"  # torch.distributed benchmark loop


class SimParams(BaseModel):
    """The simulator's free parameters (fitted by `calibration`, stored as JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launch_graph_us: float = Field(2.0, description="launch overhead, nccl-tests -G 1")
    launch_host_us: float = Field(8.0, description="launch overhead, nccl-tests")
    launch_torch_us: float = Field(20.0, description="launch overhead, torch.distributed loop")
    k_lat_intra: float = Field(1.0, description="scale on NCCL's intra-node hop latencies")
    k_lat_net_ib: float = Field(1.0, description="scale on NCCL's network hop latencies, IB/RoCE")
    k_lat_net_efa: float = Field(1.0, description="scale on NCCL's network hop latencies, EFA")
    eta_nvlink: float = Field(0.8, description="Ring/Simple efficiency of NVLink bandwidth")
    eta_net_ib: float = Field(0.9, description="efficiency of the node's NIC bandwidth, IB/RoCE")
    eta_net_efa: float = Field(0.9, description="efficiency of the node's NIC bandwidth, EFA")
    nvls_eta_inf: float = Field(0.64, description="NVLS algbw / NVLink bw for many GPUs")
    nvls_c: float = Field(0.5, description="NVLS efficiency loss ~ nvls_c / GPUs")
    cap_ll_GBps: float = Field(4.0, description="LL bus bandwidth per channel, Hopper")  # noqa: N815
    k_chunk_bytes: float = Field(8192.0, description="Simple per-chunk overhead (bytes)")
    nvls_fill: float = Field(20.0, description="NVLS pipeline fill, in chunk transfer times")
    efa_ll_factor: float = Field(0.1, description="LL bandwidth factor across EFA")


@dataclass(frozen=True)
class _Tables:
    alg_bw: F64  # (5, 7, 3) GB/s algorithm bandwidth ceiling; 0 = unavailable
    ch_cap: F64  # (5, 7, 3) GB/s algorithm bandwidth per channel
    latency: F64  # (5, 7, 3) us, without launch overhead


@dataclass(frozen=True)
class _Static:
    """Parameter-independent ingredients of a system's tables (cached per NCCL model)."""

    factor: F64  # (5,) bus factor per collective
    nccl_alg: F64  # (5, 7, 3) NCCL's algorithm bandwidth
    ring_nccl: F64  # (5,) NCCL's Ring/Simple bandwidth (1 where absent)
    avail: NDArray[np.bool_]
    inv_channels: F64  # (1, 7, 1): 1 / (0.75 x NCCL's max channels)
    lat_base: F64
    lat_intra: F64
    lat_inter: F64
    ll_scale: float
    ll128_cap: float
    simple_cap: float
    efa_multi: bool


@lru_cache(maxsize=256)
def _static(nccl: NcclModel) -> _Static:
    s = nccl.system
    colls = np.arange(len(Collective))
    factor = bus_factor(colls, s.ranks) if s.ranks > 1 else np.ones(len(Collective))
    ring = nccl.bw[:, _RING, _SIMPLE]
    arch = int(s.gpu.arch)
    max_ch = nccl.max_channels(np.arange(len(Algo))).astype(np.float64)
    return _Static(
        factor=factor,
        nccl_alg=nccl.bw.copy(),
        ring_nccl=np.where(ring > 0, ring, 1.0),
        avail=nccl.bw > 0,
        inv_channels=(1.0 / (0.75 * max_ch))[None, :, None],
        lat_base=nccl.lat_terms[..., 0],
        lat_intra=nccl.lat_terms[..., 1],
        lat_inter=nccl.lat_terms[..., 2],
        ll_scale=LL_ARCH_SCALE[arch],
        ll128_cap=float(tables.PER_CH_MAX_RING_LL128[arch, min(s.nodes, 3) - 1]),
        simple_cap=SIMPLE_CH_CAP[arch],
        efa_multi=s.fabric is Fabric.EFA and s.nodes > 1 and not s.container_split,
    )


def bus_factor(coll: ArrayLike, ranks: int) -> F64:
    """nccl-tests bus-bandwidth factor: 2(n-1)/n all-reduce, (n-1)/n AG/RS, 1 otherwise."""
    c = np.asarray(coll, dtype=np.int64)
    n = float(ranks)
    out = np.where(c == _AR, 2 * (n - 1) / n, np.where((c == _AG) | (c == _RS), (n - 1) / n, 1.0))
    return np.asarray(out, dtype=np.float64)


class Physics:
    """Physical model of one system under one parameter set."""

    def __init__(self, nccl: NcclModel, params: SimParams) -> None:
        self.nccl = nccl
        self.system: System = nccl.system
        self.params = params

    @cached_property
    def tables(self) -> _Tables:
        return self._build()

    # -- per-system ingredients -------------------------------------------
    def _net(self) -> tuple[float, float, float]:
        """(bandwidth GB/s, efficiency, latency scale) of the tier between NCCL nodes."""
        s, p = self.system, self.params
        if s.container_split:
            if s.nics:  # loop back through the NIC
                bw = s.net_node_GBps / s.containers_per_node
                return bw, self._eta_net(), self._k_net()
            return s.pcie_GBps, ETA_HOST, p.k_lat_net_ib
        return s.net_node_GBps, self._eta_net(), self._k_net()

    def _eta_net(self) -> float:
        p = self.params
        return p.eta_net_efa if self.system.fabric is Fabric.EFA else p.eta_net_ib

    def _k_net(self) -> float:
        p = self.params
        return p.k_lat_net_efa if self.system.fabric is Fabric.EFA else p.k_lat_net_ib

    def nvls_eta(self) -> float:
        """NVLS all-reduce algorithm bandwidth as a fraction of NVLink bandwidth.

        Departure `nvls-small-team`: fitted on rows h200x{5,6,7,8}-ar-8g-nvls (and
        the 8x H200 sweep); NCCL's own NVLS estimate is lower at 5 GPUs.
        """
        g = self.system.local_ranks
        return max(0.05, self.params.nvls_eta_inf * (1.0 - self.params.nvls_c / g))

    def _ring_bus(self) -> F64:
        """Ring bus bandwidth per protocol (GB/s)."""
        s, p = self.system, self.params
        limits = []
        if s.local_ranks > 1:
            eta = p.eta_nvlink if s.nvlink else ETA_PCIE
            limits.append(np.full(3, eta * s.intra_GBps))
        if s.nodes > 1:
            bw, eta, _ = self._net()
            net = np.full(3, eta * bw)
            if _static(self.nccl).efa_multi:
                # Departure `efa-ll`: rows p5-2n-ar-64k (135 us) vs p5-2n-ar-1m (123 us),
                # aws/aws-ofi-nccl#76. NCCL's model has no such penalty.
                net[_LL] *= p.efa_ll_factor
            limits.append(net)
        if not limits:
            return np.full(3, np.inf)
        ring: F64 = np.minimum.reduce(limits) * PROTO_CEILING
        return ring

    def _build(self) -> _Tables:
        s, p, st = self.system, self.params, _static(self.nccl)
        alg = st.nccl_alg.copy()  # NCCL-relative: NCCL's estimate x (ring physics / ring NCCL)
        ring_bus = self._ring_bus()
        ring_alg = ring_bus[None, :] / st.factor[:, None]
        alg *= (ring_alg[:, _SIMPLE] / st.ring_nccl)[:, None, None]
        alg[:, _RING, :] = ring_alg
        if st.efa_multi:  # departure `efa-ll` also hits Tree/LL's network legs
            alg[:, _TREE, _LL] *= p.efa_ll_factor
        nvls_alg = self.nvls_eta() * s.intra_GBps
        if s.nodes == 1:
            alg[_AR, _NVLS, _SIMPLE] = nvls_alg
        else:
            bw, eta, _ = self._net()
            tree_net = eta * bw * (1.0 if s.nodes <= 2 else 0.5)
            alg[_AR, _NVLST, _SIMPLE] = min(nvls_alg, tree_net)
        alg[~st.avail] = 0.0
        # Per-channel caps: ring per protocol, others NCCL's channel count with headroom.
        ring_ch = np.array([p.cap_ll_GBps * st.ll_scale, st.ll128_cap, st.simple_cap])
        cap = alg * st.inv_channels
        cap[:, _RING, :] = ring_ch[None, :] / st.factor[:, None]
        # Latency: NCCL's hop structure with calibrated hop latencies.
        k_net = self._net()[2] if s.nodes > 1 else 1.0
        lat = st.lat_base + p.k_lat_intra * st.lat_intra + k_net * st.lat_inter
        return _Tables(alg_bw=alg, ch_cap=cap, latency=lat)

    # -- chunking -----------------------------------------------------------
    def default_chunk(self, algo: I64, nbytes: F64, nch: I64) -> F64:
        """NCCL's Simple chunk size for a call (`calcCollChunking`, enqueue.cc)."""
        heads = float(self.system.local_ranks)
        conc = nch.astype(np.float64) * heads
        chunk = np.full(nbytes.shape, float(STEP_BYTES))
        nvls = algo == _NVLS
        c = np.full(nbytes.shape, 128.0 * 1024)
        c = np.where(nbytes < 64 * conc * c, 65536.0, c)
        c = np.where(nbytes < 8 * conc * c, 32768.0, c)
        c = np.where(nbytes < 2 * conc * c, 16384.0, c)
        chunk = np.where(nvls, c, chunk)
        t = np.full(nbytes.shape, 65536.0 if self.system.nodes >= 4 else 128.0 * 1024)
        t = np.where((nbytes < 4 * conc * t) & (t > 65536), 65536.0, t)
        t = np.where((nbytes < conc * t) & (t > 32768), 32768.0, t)
        chunk = np.where(algo == _NVLST, t, chunk)
        out: F64 = np.where((algo == _CND) | (algo == _CNC), 256.0 * 1024, chunk)
        return out

    # -- the time ---------------------------------------------------------
    def times(
        self,
        coll: ArrayLike,
        nbytes: ArrayLike,
        algo: ArrayLike,
        proto: ArrayLike,
        nch: ArrayLike,
        *,
        chunk: ArrayLike | None = None,
        launch_us: ArrayLike | None = None,
    ) -> F64:
        """Simulated time (us) per row; inf where the configuration is unavailable.

        `nch` must be >= 1 (callers resolve "NCCL default" first); `chunk` 0 or
        None means NCCL's default chunk.
        """
        t = self.tables
        c = np.asarray(coll, dtype=np.int64)
        a = np.asarray(algo, dtype=np.int64)
        p = np.asarray(proto, dtype=np.int64)
        b = np.asarray(nbytes, dtype=np.float64)
        k = np.asarray(nch, dtype=np.int64)
        user = np.asarray(0.0 if chunk is None else chunk, dtype=np.float64)
        c, a, p, b, k, user = np.broadcast_arrays(c, a, p, b, k, user)
        launch = np.asarray(self.params.launch_host_us if launch_us is None else launch_us)
        if self.system.ranks <= 1:
            return np.where((a == _RING) & (p == _SIMPLE), launch, np.inf)
        alg = t.alg_bw[c, a, p]
        bw = np.minimum(alg, k * t.ch_cap[c, a, p])
        nominal = np.where(user > 0, user, self.default_chunk(a, b, k))
        simple = p == _SIMPLE
        psi = np.where(simple, 1.0 + self.params.k_chunk_bytes / nominal, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            transfer = b / (1000.0 * bw) * psi
            nvls = (a == _NVLS) | (a == _NVLST)
            per_channel = bw / np.maximum(k, 1)
            fill = np.where(nvls, self.params.nvls_fill * nominal / (1000.0 * per_channel), 0.0)
        out = launch + t.latency[c, a, p] + transfer + fill
        out = np.where(alg > 0, out, np.inf)
        return np.asarray(out, dtype=np.float64)


def launch_for(harness: Harness, params: SimParams) -> float:
    """The launch overhead of a measurement harness."""
    if harness is Harness.NCCL_TESTS_GRAPH:
        return params.launch_graph_us
    if harness is Harness.TORCH:
        return params.launch_torch_us
    return params.launch_host_us

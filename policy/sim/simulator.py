"""The "ground truth" simulator: time and bus bandwidth of any configuration.

    sim = Simulator(load_topology(path))          # fitted parameters by default
    sim.predict(Collective.ALLREDUCE, 1 << 20)    # NCCL's own pick, simulated
    sim.times(coll, nbytes, algo, proto, nch)     # numpy batch path (the learner's)
    sim.sample(..., seed=7)                       # with seeded noise / congestion
    sim.gap(Collective.ALLREDUCE, 8 << 30)        # is NCCL's pick off the optimum?

Truth = physics (`physics.Physics`, calibrated) *anchored* to NCCL's own cost
model: a configuration c may not look faster than NCCL's pick p by more than
NCCL's model itself predicts,

    T(c) = max(T_phys(c), T_phys(p) * T_nccl(c) / T_nccl(p)),

unless a documented departure (`departures.REGISTRY`) releases c. So every
configuration that beats NCCL's default in the simulator does so for a cited
reason. Batch arguments are numpy-broadcastable integer arrays of NCCL's
indices (`Collective.nccl_id`, `Algo.nccl_id`, `Proto.nccl_id`); nch 0 and
chunk 0 mean "NCCL's default".
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import TopologySpec
from dynamiccl.policy.runtime.actions import (
    CHUNK_CHOICES,
    Constraints,
    action_mask,
    channel_choices,
    feasible_pairs,
    infeasible_reason,
)
from dynamiccl.policy.sim.calibration import load_params
from dynamiccl.policy.sim.departures import Departure, active, release_table
from dynamiccl.policy.sim.nccl_model import NcclModel
from dynamiccl.policy.sim.physics import Harness, Physics, SimParams, bus_factor, launch_for
from dynamiccl.policy.sim.system import System, resolve

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


class InfeasibleConfigError(ValueError):
    """The configuration cannot run on this topology; the message says why."""


class NoiseModel(BaseModel):
    """Run-to-run variation: lognormal jitter plus occasional network congestion."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stddev: float = Field(0.03, ge=0, le=1, description="relative jitter (lognormal sigma)")
    congestion_prob: float = Field(0.0, ge=0, le=1, description="per call, multi-node only")
    congestion_max: float = Field(0.5, ge=0, description="worst congestion slowdown (+50 %)")


@dataclass(frozen=True)
class Config:
    """One action: algorithm, protocol, channels (None: NCCL's), chunk bytes (None: NCCL's)."""

    algo: Algo
    proto: Proto
    nchannels: int | None = None
    chunk_bytes: int | None = None


@dataclass(frozen=True)
class Prediction:
    """A simulated call."""

    collective: Collective
    nbytes: int
    config: Config  # with nchannels resolved
    time_us: float
    busbw_GBps: float  # noqa: N815 - contract spelling
    nccl_default: Config
    nccl_default_time_us: float
    nccl_estimate_us: float  # NCCL's own cost-model estimate of its pick


@dataclass(frozen=True)
class Gap:
    """NCCL's pick against the simulated optimum for one (collective, size)."""

    collective: Collective
    nbytes: int
    nccl_default: Config
    nccl_time_us: float
    best: Config
    best_time_us: float
    departures: tuple[Departure, ...]

    @property
    def speedup(self) -> float:
        """NCCL's time / best time (1.0: NCCL's pick is optimal)."""
        return self.nccl_time_us / self.best_time_us


class Simulator:
    """The calibrated, NCCL-anchored simulator for one topology."""

    def __init__(
        self,
        topology: TopologySpec | System,
        params: SimParams | None = None,
        *,
        harness: Harness = Harness.NCCL_TESTS,
        noise: NoiseModel | None = None,
    ) -> None:
        self.system = topology if isinstance(topology, System) else resolve(topology)
        self.params = params or load_params()
        self.harness = harness
        self.noise = noise or NoiseModel()
        self.nccl = NcclModel(self.system)
        self.physics = Physics(self.nccl, self.params)
        self._launch = launch_for(harness, self.params)

    @cached_property
    def _released(self) -> NDArray[np.bool_]:
        return np.stack([release_table(self.system, c) for c in Collective])

    # -- batch path --------------------------------------------------------
    def nccl_pick(self, coll: ArrayLike, nbytes: ArrayLike) -> tuple[I64, I64, I64, F64]:
        """NCCL's (algo, proto, nch) and its own estimate, per call."""
        a, p, est = self.nccl.pick(coll, nbytes)
        b = np.asarray(nbytes, dtype=np.float64).reshape(-1)
        return a, p, self.nccl.channels(a, p, b), est

    def times(
        self,
        coll: ArrayLike,
        nbytes: ArrayLike,
        algo: ArrayLike,
        proto: ArrayLike,
        *,
        nch: ArrayLike = 0,
        chunk: ArrayLike = 0,
    ) -> F64:
        """Mean simulated time (us) per row; inf for an unavailable configuration."""
        c, b, a, p, k, ch = (
            np.asarray(x).reshape(-1) if np.ndim(x) else np.asarray([x])
            for x in (coll, nbytes, algo, proto, nch, chunk)
        )
        c, b, a, p, k, ch = np.broadcast_arrays(c, b, a, p, k, ch)
        c = c.astype(np.int64)
        a = a.astype(np.int64)
        p = p.astype(np.int64)
        b = b.astype(np.float64)
        k_def = self.nccl.channels(a, p, b)
        k = np.where(k.astype(np.int64) > 0, k, k_def)
        phys = self.physics.times(c, b, a, p, k, chunk=ch, launch_us=self._launch)
        if self.system.ranks <= 1:
            return phys
        phys_def = self.physics.times(c, b, a, p, k_def, launch_us=self._launch)
        table = self.nccl.times(c, b)  # NCCL's estimate of every (algo, proto)
        rows = np.arange(c.size)
        best = np.argmin(table.reshape(c.size, -1), axis=1)
        pa, pp = best // len(Proto), best % len(Proto)
        pk = self.nccl.channels(pa, pp, b)
        anchor = self.physics.times(c, b, pa, pp, pk, launch_us=self._launch)
        with np.errstate(invalid="ignore"):
            ratio = table[rows, a, p] / table[rows, pa, pp]
        # Level 1: (algo, proto) at NCCL's channels and chunk, anchored to NCCL's pick.
        released = self._released[c, pa, pp, a, p]
        level1 = np.where(released, phys_def, np.maximum(phys_def, anchor * ratio))
        # Level 2: NCCL's model has no view on channels / chunk (2.27's time does not
        # depend on them), so a variant never beats its (algo, proto) at NCCL's values.
        out = np.maximum(phys, level1)
        return np.where(np.isfinite(phys), out, np.inf)

    def sample(
        self,
        coll: ArrayLike,
        nbytes: ArrayLike,
        algo: ArrayLike,
        proto: ArrayLike,
        *,
        nch: ArrayLike = 0,
        chunk: ArrayLike = 0,
        seed: int,
    ) -> F64:
        """Noisy measurements (us), deterministic for a given seed and topology."""
        mean = self.times(coll, nbytes, algo, proto, nch=nch, chunk=chunk)
        key = zlib.crc32(self.system.spec.name.encode())
        rng = np.random.default_rng([seed, key])
        sigma = self.noise.stddev
        jitter = np.exp(rng.normal(0.0, sigma, mean.shape) - sigma * sigma / 2)
        slow = np.ones(mean.shape)
        if self.system.physical_nodes > 1 and self.noise.congestion_prob > 0:
            hit = rng.random(mean.shape) < self.noise.congestion_prob
            slow = np.where(hit, 1.0 + rng.random(mean.shape) * self.noise.congestion_max, 1.0)
        out: F64 = mean * jitter * slow
        return out

    # -- scalar conveniences -----------------------------------------------
    def nccl_default(self, coll: Collective, nbytes: int) -> tuple[Config, float, float]:
        """NCCL's pick, its simulated time and NCCL's own estimate."""
        a, p, k, est = self.nccl_pick([coll.nccl_id], [nbytes])
        cfg = Config(list(Algo)[int(a[0])], list(Proto)[int(p[0])], int(k[0]))
        t = self.times(coll.nccl_id, nbytes, a, p, nch=k)
        return cfg, float(t[0]), float(est[0])

    def predict(
        self,
        coll: Collective,
        nbytes: int,
        config: Config | None = None,
        constraints: Constraints | None = None,
    ) -> Prediction:
        """Simulate one call; InfeasibleConfigError says why a configuration cannot run."""
        if nbytes < 0:
            raise InfeasibleConfigError(f"bytes: must be >= 0 (got {nbytes})")
        default, default_t, est = self.nccl_default(coll, nbytes)
        cfg = config or default
        reason = infeasible_reason(
            self.system, coll, cfg.algo, cfg.proto, nchannels=cfg.nchannels, constraints=constraints
        )
        if reason is not None:
            raise InfeasibleConfigError(reason)
        if config is None:
            t = default_t
        else:
            t = float(
                self.times(
                    coll.nccl_id,
                    nbytes,
                    cfg.algo.nccl_id,
                    cfg.proto.nccl_id,
                    nch=cfg.nchannels or 0,
                    chunk=cfg.chunk_bytes or 0,
                )[0]
            )
        nch = cfg.nchannels or int(
            self.nccl.channels([cfg.algo.nccl_id], [cfg.proto.nccl_id], [nbytes])[0]
        )
        resolved = Config(cfg.algo, cfg.proto, nch, cfg.chunk_bytes)
        return Prediction(
            collective=coll,
            nbytes=nbytes,
            config=resolved,
            time_us=float(t),
            busbw_GBps=busbw(coll, nbytes, float(t), self.system.ranks),
            nccl_default=default,
            nccl_default_time_us=default_t,
            nccl_estimate_us=est,
        )

    def configs(
        self, coll: Collective, constraints: Constraints | None = None, *, chunks: bool = False
    ) -> list[Config]:
        """Every feasible configuration: (algo, proto) x channel choices (x chunk choices)."""
        mask = action_mask(self.system, coll, constraints)
        chunk_opts: tuple[int | None, ...] = (None, *CHUNK_CHOICES) if chunks else (None,)
        out = []
        for a, p in feasible_pairs(mask):
            for n in (None, *channel_choices(constraints)):
                for ck in chunk_opts if p is Proto.SIMPLE else (None,):
                    out.append(Config(a, p, n, ck))
        return out

    def config_times(self, coll: Collective, nbytes: int, configs: Sequence[Config]) -> F64:
        """Mean time of each configuration for one call (batch path)."""
        return self.times(
            coll.nccl_id,
            nbytes,
            [c.algo.nccl_id for c in configs],
            [c.proto.nccl_id for c in configs],
            nch=[c.nchannels or 0 for c in configs],
            chunk=[c.chunk_bytes or 0 for c in configs],
        )

    def gap(self, coll: Collective, nbytes: int, constraints: Constraints | None = None) -> Gap:
        """NCCL's pick vs the simulated optimum over every feasible configuration."""
        default, default_t, _ = self.nccl_default(coll, nbytes)
        cands = self.configs(coll, constraints, chunks=True)
        t = self.config_times(coll, nbytes, cands)
        i = int(np.argmin(t))
        best_t = float(t[i])
        best = cands[i] if best_t < default_t else default
        return Gap(
            collective=coll,
            nbytes=nbytes,
            nccl_default=default,
            nccl_time_us=default_t,
            best=best,
            best_time_us=min(best_t, default_t),
            departures=active(self.system, coll),
        )


def busbw(coll: Collective, nbytes: int, time_us: float, ranks: int) -> float:
    """nccl-tests bus bandwidth (GB/s) of a call (docs/simulator.md, 'Bus bandwidth')."""
    if time_us <= 0 or ranks <= 1:
        return 0.0
    return float(nbytes * bus_factor(coll.nccl_id, ranks) / (time_us * 1e3))

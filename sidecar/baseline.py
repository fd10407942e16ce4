"""What NCCL's own choice costs: the baseline every reward record is compared with.

`NcclDefaults` answers, from the job's state features and the policy package's
re-implementation of NCCL's cost model (`policy/sim/nccl_model.py`), which
(algorithm, protocol) NCCL picks for a call of a communicator shape (the world,
one inside a node, or a group across up to the job's nodes), and NCCL's own time
estimate of it. `Baseline` holds the *measured* mean time of that
default per (collective, size bucket, nranks, nnodes): samples of calls where
the plugin left NCCL's choice alone, or forced exactly NCCL's pick with NCCL's
channels and chunk size.

`nccl_default_time_us` of a reward record is the measured mean when there is
one, else NCCL's estimate for the bucket (its cost model, not a measurement:
stated in docs/learning-loop.md), else the record's own mean (speedup 1).
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from dynamiccl.api.features import StateFeatures
from dynamiccl.policy.runtime.compile import shape_spec
from dynamiccl.policy.runtime.encode import job_spec
from dynamiccl.policy.sim.nccl_model import NcclModel
from dynamiccl.policy.sim.system import System, derive_spec, resolve

log = logging.getLogger("dynamiccl.sidecar.baseline")

CellShape = tuple[int, int, int, int]  # (coll, bucket, nranks, nnodes)


class NcclDefaults:
    """NCCL's pick and estimate for the job's communicator shapes (None: unknown shape)."""

    def __init__(self, features: StateFeatures | None) -> None:
        self.features = features
        self._models: dict[tuple[int, int], NcclModel | None] = {}
        self.pick = lru_cache(maxsize=4096)(self._pick)

    def _system(self, nranks: int, nnodes: int) -> System | None:
        if self.features is None:
            return None
        spec = job_spec(self.features)
        world = resolve(spec)
        if (world.ranks, world.nodes) == (nranks, nnodes):
            return world
        if nnodes == 1 and nranks <= spec.gpus_per_node and spec.gpus_per_node % nranks == 0:
            # a communicator inside one NCCL node (pod): that many GPUs of one machine
            return resolve(derive_spec(spec, nodes=1, container_gpus=nranks))
        if 1 < nnodes <= world.nodes and nranks // nnodes <= world.local_ranks:
            # a group across nodes (DP, PP, EP, CP, or one no annotation names): the
            # topology the table compiler gives it (policy/runtime/compile.py)
            return resolve(shape_spec(spec, nranks, nnodes))
        return None

    def model(self, nranks: int, nnodes: int) -> NcclModel | None:
        """The NCCL cost model of one communicator shape (cached)."""
        key = (nranks, nnodes)
        if key not in self._models:
            try:
                sys = self._system(nranks, nnodes)
                self._models[key] = None if sys is None else NcclModel(sys)
            except Exception as exc:  # a spec the policy cannot resolve: no estimate
                log.info("no NCCL model for %d ranks / %d nodes: %s", nranks, nnodes, exc)
                self._models[key] = None
        return self._models[key]

    def _pick(
        self, coll: int, bucket: int, nranks: int, nnodes: int
    ) -> tuple[int, int, float] | None:
        """(algo, proto, NCCL's estimate in us) at the bucket's geometric middle."""
        m = self.model(nranks, nnodes)
        if m is None:
            return None
        a, p, t = m.pick([coll], [2.0 ** (bucket + 0.5)])
        est = float(t[0])
        if not est > 0 or est == float("inf"):
            return None
        return int(a[0]), int(p[0]), est


class Baseline:
    """Measured mean time of NCCL's own choice per cell shape (persisted with the spool)."""

    def __init__(self, defaults: NcclDefaults) -> None:
        self.defaults = defaults
        self._sum: dict[CellShape, list[float]] = {}  # shape -> [count, sum_us]

    def is_default(self, shape: CellShape, arm: tuple[int, int, int, int], forced: bool) -> bool:
        """Is a sample of `arm` (forced by the table, or not) a measurement of NCCL's pick?"""
        if not forced:
            return True
        algo, proto, nchannels, chunk = arm
        if nchannels or chunk:
            return False
        pick = self.defaults.pick(*shape)
        return pick is not None and (pick[0], pick[1]) == (algo, proto)

    def observe(self, shape: CellShape, time_us: float) -> None:
        acc = self._sum.setdefault(shape, [0.0, 0.0])
        acc[0] += 1
        acc[1] += time_us

    def measured(self, shape: CellShape) -> float | None:
        acc = self._sum.get(shape)
        return acc[1] / acc[0] if acc and acc[0] else None

    def time_us(self, shape: CellShape, fallback: float) -> float:
        """Measured default, else NCCL's estimate, else `fallback`."""
        got = self.measured(shape)
        if got is not None:
            return got
        pick = self.defaults.pick(*shape)
        return pick[2] if pick is not None else fallback

    def to_state(self) -> list[Any]:
        return [[list(k), v] for k, v in sorted(self._sum.items())]

    def load_state(self, raw: list[Any]) -> None:
        self._sum = {
            (int(k[0]), int(k[1]), int(k[2]), int(k[3])): [float(v[0]), float(v[1])] for k, v in raw
        }

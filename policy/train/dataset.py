"""Labelled calls from the simulator: observations, masks and every (algo, proto)'s time.

For a job and a batch of its calls this computes, once: the observation rows,
the (algorithm, protocol) feasibility, the simulated mean time of every
(algorithm, protocol) at NCCL's own channels and chunk, and NCCL's own pick
with its simulated time. Imitation targets, evaluation metrics and the
benchmark suite all read these arrays. The simulator never lets a channel or
chunk variant beat its (algorithm, protocol) at NCCL's values
(`simulator.Simulator.times`, level 2), so the oracle over the full action
space is the best (algorithm, protocol) at channel/chunk option 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.runtime.actions import action_mask
from dynamiccl.policy.runtime.encode import JobContext, encode_calls
from dynamiccl.policy.runtime.space import ActionLimits
from dynamiccl.policy.sim.simulator import Simulator

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
B8 = NDArray[np.bool_]
N_A, N_P = len(Algo), len(Proto)


@dataclass(frozen=True)
class Labelled:
    """A batch of labelled calls (rows may come from many jobs)."""

    obs: F32  # [n, OBS_DIM]
    ap_mask: B8  # [n, A, P]
    times: F64  # [n, A, P] simulated mean time at NCCL's channels/chunk; inf = infeasible
    nccl_ap: I64  # [n] NCCL's pick as a * P + p
    nccl_time: F64  # [n] simulated time of NCCL's pick (with NCCL's channels)
    coll: I64  # [n]
    nbytes: F64  # [n]
    job: I64  # [n] index of the job each row belongs to

    @property
    def best_ap(self) -> I64:
        """Oracle (algo, proto) as a * P + p (ties: lowest index)."""
        out: I64 = np.argmin(self.times.reshape(len(self.obs), -1), axis=1)
        return out

    @property
    def best_time(self) -> F64:
        out: F64 = np.min(self.times.reshape(len(self.obs), -1), axis=1)
        return out

    def __len__(self) -> int:
        return len(self.obs)


def label_calls(
    ctx: JobContext,
    sim: Simulator,
    coll: Sequence[int] | I64,
    nbytes: Sequence[float] | F64,
    *,
    limits: ActionLimits | None = None,
    job: int = 0,
) -> Labelled:
    """Label a batch of calls of one job."""
    c = np.asarray(coll, dtype=np.int64).reshape(-1)
    b = np.asarray(nbytes, dtype=np.float64).reshape(-1)
    n = c.size
    obs, _view = encode_calls(ctx, sim.nccl, c, b)
    cons = (limits or ActionLimits()).constraints()
    masks = {k: action_mask(ctx.system, list(Collective)[k], cons) for k in set(c.tolist())}
    ap = np.stack([masks[int(k)] for k in c]) if n else np.zeros((0, N_A, N_P), dtype=bool)
    a_grid = np.repeat(np.arange(N_A), N_P)
    p_grid = np.tile(np.arange(N_P), N_A)
    t = sim.times(
        np.repeat(c, N_A * N_P), np.repeat(b, N_A * N_P), np.tile(a_grid, n), np.tile(p_grid, n)
    ).reshape(n, N_A, N_P)
    t = np.where(ap, t, np.inf)
    pa, pp, pk, _ = sim.nccl_pick(c, b)
    nccl_t = sim.times(c, b, pa, pp, nch=pk)
    return Labelled(
        obs=obs,
        ap_mask=ap,
        times=t,
        nccl_ap=pa * N_P + pp,
        nccl_time=nccl_t,
        coll=c,
        nbytes=b,
        job=np.full(n, job, dtype=np.int64),
    )


def concat(parts: Sequence[Labelled]) -> Labelled:
    """Rows of several batches, in order."""
    return Labelled(
        obs=np.concatenate([p.obs for p in parts]),
        ap_mask=np.concatenate([p.ap_mask for p in parts]),
        times=np.concatenate([p.times for p in parts]),
        nccl_ap=np.concatenate([p.nccl_ap for p in parts]),
        nccl_time=np.concatenate([p.nccl_time for p in parts]),
        coll=np.concatenate([p.coll for p in parts]),
        nbytes=np.concatenate([p.nbytes for p in parts]),
        job=np.concatenate([p.job for p in parts]),
    )


def subset(data: Labelled, idx: I64) -> Labelled:
    """Rows `idx` of a batch."""
    return Labelled(
        obs=data.obs[idx],
        ap_mask=data.ap_mask[idx],
        times=data.times[idx],
        nccl_ap=data.nccl_ap[idx],
        nccl_time=data.nccl_time[idx],
        coll=data.coll[idx],
        nbytes=data.nbytes[idx],
        job=data.job[idx],
    )

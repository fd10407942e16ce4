"""How good a policy's choices are under the simulator: speedup vs NCCL, fraction of oracle.

For every labelled call: the policy's greedy action is simulated (with its
channels and chunk), then compared with NCCL's own pick (speedup = NCCL's
time / policy's time) and with the oracle over the whole action space
(fraction = oracle time / policy's time). Aggregates are geometric means; the
"differ" subset holds the calls where NCCL's pick is more than 1 % off the
simulated optimum, i.e. where NCCL's model and (simulated) reality disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict

from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.train.dataset import Labelled

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
DIFFER: float = 1.01


class Metrics(BaseModel):
    """Aggregates over a set of calls (geometric means)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    calls: int
    speedup: float  # vs NCCL's default
    oracle_fraction: float
    worst_speedup: float  # min over calls
    below_default_2pct: int  # calls more than 2 % slower than NCCL's default
    differ_calls: int
    differ_speedup: float | None  # on calls where NCCL's pick is off the optimum
    differ_oracle_speedup: float | None  # the best achievable there


def _geo(x: F64) -> float:
    return float(np.exp(np.mean(np.log(x)))) if x.size else float("nan")


def action_times(sims: Sequence[Simulator], data: Labelled, actions: I64) -> F64:
    """Simulated mean time of `actions` [n, 4] (head indices) for every row."""
    out = np.empty(len(data))
    ch = np.asarray(CHANNEL_OPTIONS)[actions[:, 2]]
    ck = np.asarray(CHUNK_OPTIONS)[actions[:, 3]]
    for j in np.unique(data.job):
        rows = np.nonzero(data.job == j)[0]
        out[rows] = sims[int(j)].times(
            data.coll[rows],
            data.nbytes[rows],
            actions[rows, 0],
            actions[rows, 1],
            nch=ch[rows],
            chunk=ck[rows],
        )
    return out


def metrics(data: Labelled, policy_time: F64) -> Metrics:
    """Aggregate a policy's simulated times over labelled calls."""
    speed = data.nccl_time / policy_time
    frac = np.minimum(data.best_time, data.nccl_time) / policy_time
    differ = data.nccl_time / data.best_time > DIFFER
    return Metrics(
        calls=len(data),
        speedup=_geo(speed),
        oracle_fraction=_geo(frac),
        worst_speedup=float(np.min(speed)) if speed.size else float("nan"),
        below_default_2pct=int(np.sum(speed < 1.0 / 1.02)),
        differ_calls=int(differ.sum()),
        differ_speedup=_geo(speed[differ]) if differ.any() else None,
        differ_oracle_speedup=_geo(data.nccl_time[differ] / data.best_time[differ])
        if differ.any()
        else None,
    )


@dataclass(frozen=True)
class Evaluation:
    """Per-call results plus the aggregate."""

    policy_time: F64
    metrics: Metrics

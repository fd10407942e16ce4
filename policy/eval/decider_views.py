"""What a job's `Decider` says about a response surface's rows, as `dynamiccl bench tune`
feeds its tuner: the learned policy's prior (`policy_prior`), NCCL's own pick
(`nccl_pick`) and NCCL's time estimate of every (algo, proto) (`nccl_estimate`, what the
sidecar's pair probes are gated by)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.eval.bench_tune import Arm, DefaultPick, Estimate, Prior
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.runtime.space import channel_index


def policy_prior(decider: Decider) -> Prior:
    """Scores = the learned policy's log-probability of each row's configuration.

    A row's channel count maps to the nearest channel option; the chunk is
    NCCL's (surfaces have no chunk column). Rows the policy considers
    infeasible score -1e9 (explored only if nothing else is left).
    """

    def prior(coll: Collective, nbytes: int, arms: Sequence[Arm]) -> list[float]:
        obs, feasible, _ = decider.inputs(
            np.array([coll.nccl_id]), np.array([float(nbytes)], dtype=np.float64)
        )
        logp = decider.policy.joint_log_probs(obs, feasible)[0]
        out = []
        for a in arms:
            v = float(logp[a.algo.nccl_id, a.proto.nccl_id, channel_index(a.nchannels), 0])
            out.append(v if math.isfinite(v) else -1e9)
        return out

    return prior


def nccl_pick(decider: Decider) -> DefaultPick:
    """NCCL's own (algo, proto) with its channel count (the row with empty nchannels)."""

    def pick(coll: Collective, nbytes: int, arms: Sequence[Arm]) -> int | None:
        d = decider.nccl_choice(coll, nbytes)
        same = [i for i, a in enumerate(arms) if (a.algo, a.proto) == (d.algo, d.proto)]
        exact = [i for i in same if arms[i].nchannels is None]
        found = exact or same
        return found[0] if found else None

    return pick


def nccl_estimate(decider: Decider) -> Estimate:
    """NCCL's estimate of every (algo, proto) it can run for a call (its cost model)."""

    def estimate(coll: Collective, nbytes: int) -> dict[tuple[Algo, Proto], float]:
        t = decider.nccl.times([coll.nccl_id], [nbytes])[0]
        return {
            (a, p): float(t[a.nccl_id, p.nccl_id])
            for a in Algo
            for p in Proto
            if math.isfinite(float(t[a.nccl_id, p.nccl_id]))
        }

    return estimate

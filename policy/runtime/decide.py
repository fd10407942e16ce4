"""The learned policy's decisions for calls of a job (greedy, fresh LSTM state).

`Decider` wraps a loaded policy (a `ranker.Ranker`: torch or numpy) for one
communicator: it encodes calls, builds their feasibility masks (NCCL's
availability and the user's limits), and returns the greedy configuration or a
ranking of configurations by the policy's joint probability. A job whose
features say "passthrough" (in-network aggregation active, or a library other
than NCCL) gets NCCL's own choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Choice
from dynamiccl.api.topology import TopologySpec
from dynamiccl.policy.runtime.actions import action_mask, passthrough_reason
from dynamiccl.policy.runtime.encode import (
    JobContext,
    call_obs,
    nccl_latency,
    nccl_times,
    static_vector,
    view_of,
)
from dynamiccl.policy.runtime.ranker import Ranker
from dynamiccl.policy.runtime.space import ActionLimits, joint_mask, to_choice
from dynamiccl.policy.sim.nccl_model import NcclModel

F32 = NDArray[np.float32]
B8 = NDArray[np.bool_]


class Decision(BaseModel):
    """One call's decision (the `policy decide --json` document)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collective: Collective
    nbytes: int
    algo: Algo
    proto: Proto
    nchannels: int  # 0 = NCCL's own channel count
    chunk_bytes: int  # 0 = NCCL's own chunk size
    probability: float  # the policy's probability of this configuration
    nccl_default: Choice  # NCCL's own pick (its cost model)
    passthrough: bool = False
    reason: str = ""


def passthrough(features: StateFeatures | None) -> str | None:
    """Why a job must be left to NCCL (None: tune it)."""
    if features is None:
        return None
    t = features.topology
    return passthrough_reason(ccl_library=t.ccl_library.value, in_network_aggregation=t.ina_active)


@dataclass
class Decider:
    """The policy applied to one communicator's calls."""

    policy: Ranker
    ctx: JobContext
    limits: ActionLimits = field(default_factory=ActionLimits)
    tau: float | None = None  # confidence needed to leave NCCL's (algo, proto); None: the model's

    def __post_init__(self) -> None:
        self.nccl = NcclModel(self.ctx.system)
        self.static = static_vector(self.ctx)
        self.latency = nccl_latency(self.nccl)
        cons = self.limits.constraints()
        self._ap_stack = np.stack([action_mask(self.ctx.system, c, cons) for c in Collective])
        self._joint = joint_mask(self._ap_stack, self.limits)  # [collective, A, P, C, K]
        self._empty: B8 = np.logical_not(self._joint.reshape(len(self._joint), -1).any(1))

    @classmethod
    def of(
        cls,
        policy: Ranker,
        job: TopologySpec | StateFeatures,
        limits: ActionLimits | None = None,
        tau: float | None = None,
    ) -> Decider:
        """A decider for a topology spec or a job's state features."""
        return cls(policy, JobContext.of(job), limits or ActionLimits(), tau)

    def inputs(
        self, colls: NDArray[np.int64], nbytes: NDArray[np.float64]
    ) -> tuple[F32, B8, NDArray[np.int64]]:
        """Observations, joint feasibility and NCCL's (algo, proto) pick for a batch of calls."""
        return stacked_inputs([self], colls, nbytes)

    def nccl_choice(self, coll: Collective, nbytes: int) -> Choice:
        """NCCL's own (algo, proto) for a call, channels and chunk left to NCCL."""
        a, p, _ = self.nccl.pick([coll.nccl_id], [nbytes])
        return Choice(algo=list(Algo)[int(a[0])], proto=list(Proto)[int(p[0])])

    def decide(self, coll: Collective, nbytes: int) -> Decision:
        """The greedy configuration for one call."""
        reason = passthrough(self.ctx.features)
        default = self.nccl_choice(coll, nbytes)
        if reason is not None:
            return Decision(
                collective=coll,
                nbytes=nbytes,
                algo=default.algo,
                proto=default.proto,
                nchannels=0,
                chunk_bytes=0,
                probability=1.0,
                nccl_default=default,
                passthrough=True,
                reason=reason,
            )
        obs, feasible, pick = self.inputs(np.array([coll.nccl_id]), np.array([float(nbytes)]))
        acts, probs = self.policy.decide(obs, feasible, pick, self.tau)
        choice = to_choice(acts[0])
        return Decision(
            collective=coll,
            nbytes=nbytes,
            algo=choice.algo,
            proto=choice.proto,
            nchannels=choice.nchannels,
            chunk_bytes=choice.chunk_bytes,
            probability=float(probs[0]),
            nccl_default=default,
        )

    def rank(
        self, colls: NDArray[np.int64], nbytes: NDArray[np.float64], top: int
    ) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.int64]]:
        """The `top` most probable configurations of each call (greedy first).

        Returns head-index actions [n, top, 4], their probabilities [n, top]
        (0 for padding) and NCCL's (algo, proto) pick [n, 2].
        """
        obs, feasible, pick = self.inputs(colls, nbytes)
        acts, probs = self.policy.top_actions(obs, feasible, top, pick, self.tau)
        return acts, probs, pick


def stacked_inputs(
    deciders: Sequence[Decider], colls: NDArray[np.int64], nbytes: NDArray[np.float64]
) -> tuple[F32, B8, NDArray[np.int64]]:
    """`Decider.inputs` of the same calls for each decider's communicator, stacked in
    decider order, encoded in one pass (the rows are the same as one decider at a time)."""
    for d in deciders:
        empty = d._empty[colls]
        if empty.any():
            coll = list(Collective)[int(colls[np.argmax(empty)])]
            raise ValueError(
                f"{coll.value}: no configuration satisfies the constraints on this topology"
            )
    times = [nccl_times(d.nccl, colls, nbytes, d.latency) for d in deciders]
    view = view_of(*(np.concatenate(parts) for parts in zip(*times, strict=True)))
    which = np.repeat(np.arange(len(deciders)), len(colls))
    all_colls, all_bytes = np.tile(colls, len(deciders)), np.tile(nbytes, len(deciders))
    static = np.stack([d.static for d in deciders])[which]
    ranks = np.array([d.ctx.system.ranks for d in deciders], dtype=np.int64)[which]
    obs = call_obs(static, view, all_colls, all_bytes, ranks)
    feasible = np.stack([d._joint for d in deciders])[which, all_colls]
    pick = np.stack([view.pick_algo, view.pick_proto], axis=1)
    return obs, feasible, pick

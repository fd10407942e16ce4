"""Decisions of a (small, untrained) policy: feasible, passthrough, ranked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import parse_topology
from dynamiccl.policy.runtime.actions import action_mask
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.runtime.space import ActionLimits
from dynamiccl.policy.train.inference import new_policy
from tests.topology_samples import dgx_h100

NODE: dict[str, Any] = dgx_h100("h100")
POLICY = new_policy(0, hidden=16)
POLICY.net.eval()


@pytest.mark.parametrize("coll", list(Collective))
def test_decisions_are_feasible(coll: Collective) -> None:
    d = Decider.of(POLICY, parse_topology(NODE))
    mask = action_mask(d.ctx.system, coll)
    for n in (8, 1 << 16, 1 << 30):
        dec = d.decide(coll, n)
        assert mask[dec.algo.nccl_id, dec.proto.nccl_id]
        assert 0 < dec.probability <= 1
        assert mask[dec.nccl_default.algo.nccl_id, dec.nccl_default.proto.nccl_id]
        assert not dec.passthrough


def test_constraints_are_obeyed() -> None:
    lim = ActionLimits(algos=frozenset({Algo.RING}), protos=frozenset({Proto.SIMPLE}))
    d = Decider.of(POLICY, parse_topology(NODE), lim)
    for n in (8, 1 << 20, 1 << 34):
        dec = d.decide(Collective.ALLREDUCE, n)
        assert (dec.algo, dec.proto) == (Algo.RING, Proto.SIMPLE)
    only_nvls = ActionLimits(algos=frozenset({Algo.NVLS}))
    with pytest.raises(ValueError, match="broadcast: no configuration"):
        Decider.of(POLICY, parse_topology(NODE), only_nvls).decide(Collective.BROADCAST, 8)


def test_passthrough_for_non_nccl_library() -> None:
    feats = StateFeatures.model_validate(
        {
            "world_size": 16,
            "gpus_per_pod": 8,
            "replicas": 2,
            "nproc_per_node": 8,
            "topology": {
                **NODE,
                "tier_max": "same_rack",
                "tier_mix": {"same_rack": 1.0, "same_node": 0.0},
                "ccl_library": "gloo",
            },
        }
    )
    dec = Decider.of(POLICY, feats).decide(Collective.ALLREDUCE, 1 << 20)
    assert dec.passthrough
    assert "gloo" in dec.reason
    assert (dec.algo, dec.proto) == (dec.nccl_default.algo, dec.nccl_default.proto)
    assert dec.nchannels == 0


def test_rank_puts_the_decision_first_and_sorts_the_rest() -> None:
    d = Decider.of(POLICY, parse_topology(NODE))
    colls = np.array([4, 2, 0])
    sizes = np.array([1024.0, 1 << 20, 1 << 30])
    acts, probs, pick = d.rank(colls, sizes, 6)
    assert acts.shape == (3, 6, 4)
    assert pick.shape == (3, 2)
    obs, feas, _ = d.inputs(colls, sizes)
    first, _ = POLICY.decide(obs, feas, pick)
    assert (acts[:, 0] == first).all()
    for i in range(3):
        keys = {tuple(a) for a, p in zip(acts[i], probs[i], strict=True) if p > 0}
        assert len(keys) == int((probs[i] > 0).sum())  # no duplicates
        assert (np.diff(probs[i, 1:]) <= 1e-6).all()  # beam results best first
        for a, p in zip(acts[i], probs[i], strict=True):
            if p > 0:
                assert feas[i][tuple(a)]


def test_low_confidence_deviations_fall_back_to_nccl() -> None:
    d = Decider.of(POLICY, parse_topology(NODE))
    colls = np.repeat(np.arange(5), 8)
    sizes = np.tile(2.0 ** np.arange(3, 35, 4), 5)
    obs, feas, pick = d.inputs(colls, sizes)
    greedy = POLICY.greedy(obs, feas)
    never, _ = POLICY.decide(obs, feas, pick, tau=0.0)
    assert (never == greedy).all()
    always, _ = POLICY.decide(obs, feas, pick, tau=1.01)
    assert (always[:, :2] == pick).all()  # an untrained policy is never confident enough
    assert (always[:, 2:] == 0).all()

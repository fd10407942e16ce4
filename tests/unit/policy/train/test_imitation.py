"""Imitation warm start: targets prefer NCCL on ties, and the loss goes down."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dynamiccl.api.topology import parse_topology
from dynamiccl.policy.runtime.encode import JobContext
from dynamiccl.policy.runtime.space import ActionLimits, joint_mask
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.train.dataset import Labelled, label_calls
from dynamiccl.policy.train.imitation import ImitationConfig, targets, train_imitation
from dynamiccl.policy.train.inference import new_policy

NODE: dict[str, Any] = {
    "name": "h200x5",
    "gpu": "H200",
    "gpus_per_node": 5,
    "nodes": 1,
    "intra": "nvswitch",
    "nvlink_GBps": 450,
    "nvls": True,
    "pcie_gen": 5,
    "nics_per_node": 0,
    "nic_Gbps": 0,
    "fabric": "none",
    "sharp": False,
}


def _data() -> Labelled:
    ctx = JobContext.of(parse_topology(NODE))
    sim = Simulator(ctx.system)
    coll = np.repeat(np.arange(5), 16)
    nbytes = np.tile(2.0 ** np.arange(3, 35, 2), 5)
    return label_calls(ctx, sim, coll, nbytes)


def test_targets() -> None:
    data = _data()
    acts, stake = targets(data)
    n = len(data)
    assert (acts[:, 2:] == 0).all()  # NCCL's channels and chunk
    ap = acts[:, 0] * 3 + acts[:, 1]
    t_target = data.times.reshape(n, -1)[np.arange(n), ap]
    assert (t_target <= data.best_time * (1 + 1e-3)).all()
    equal = data.nccl_time <= data.best_time * (1 + 1e-3)
    assert (ap[equal] == data.nccl_ap[equal]).all()  # ties go to NCCL's pick
    assert (stake >= 0).all()
    assert stake.max() > 0.05  # the NVLS small-team departure at large sizes


def test_loss_decreases_and_is_seeded() -> None:
    data = _data()

    def go() -> list[float]:
        pol = new_policy(0, hidden=32)
        return train_imitation(
            pol.net,
            data,
            ImitationConfig(steps=60, batch=64),
            limits=ActionLimits(),
            gen=torch.Generator().manual_seed(0),
            rng=np.random.default_rng(0),
        )

    a = go()
    assert np.mean(a[-10:]) < 0.5 * np.mean(a[:10])
    assert a == go()


def _expected_loss_vs_nccl(pol_net: Any, data: Labelled) -> float:
    """E_pi[max(0, log(t / t_nccl))] over the calls, under the net's (algo, proto) marginals."""
    masks = torch.from_numpy(joint_mask(data.ap_mask, ActionLimits()))
    with torch.no_grad():
        x = torch.from_numpy(data.obs)[:, None, :]
        prev = torch.full((len(data), 1, 4), -1, dtype=torch.long)
        h, _ = pol_net.trunk(x, prev, torch.zeros(len(data), 1))
        pairs = pol_net.pair_log_probs(h[:, 0], masks).exp().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = np.log(data.times / data.nccl_time[:, None, None])
    lv = np.where(np.isfinite(lv), np.clip(lv, 0.0, 5.0), 0.0)
    return float((pairs * lv).sum((1, 2)).mean())


def test_loss_aversion_moves_probability_off_choices_slower_than_nccls() -> None:
    data = _data()

    def trained(loss_aversion: float) -> float:
        pol = new_policy(0, hidden=32)
        train_imitation(
            pol.net,
            data,
            ImitationConfig(steps=40, batch=64, loss_aversion=loss_aversion),
            limits=ActionLimits(),
            gen=torch.Generator().manual_seed(0),
            rng=np.random.default_rng(0),
        )
        return _expected_loss_vs_nccl(pol.net, data)

    untrained = _expected_loss_vs_nccl(new_policy(0, hidden=32).net, data)
    plain, averse = trained(0.0), trained(50.0)
    assert untrained > 0.05  # the fresh net puts real mass on slower choices
    assert averse < 0.9 * plain, (plain, averse)  # seeded: 0.049 -> 0.040 when written

"""Labelled calls: oracle, NCCL's pick and masks agree with the simulator."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynamiccl.api.nccl import Algo
from dynamiccl.api.topology import parse_topology
from dynamiccl.policy.runtime.encode import OBS_DIM, JobContext
from dynamiccl.policy.runtime.space import ActionLimits
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.train.dataset import concat, label_calls, subset

H100: dict[str, Any] = {
    "name": "dgx-h100",
    "gpu": "H100",
    "gpus_per_node": 8,
    "nodes": 1,
    "intra": "nvswitch",
    "nvlink_GBps": 450,
    "nvls": True,
    "pcie_gen": 5,
    "nics_per_node": 8,
    "nic_Gbps": 400,
    "fabric": "infiniband",
    "sharp": False,
}


def _label(limits: ActionLimits | None = None, job: int = 0):  # type: ignore[no-untyped-def]
    ctx = JobContext.of(parse_topology(H100))
    sim = Simulator(ctx.system)
    coll = np.repeat(np.arange(5), 8)
    nbytes = np.tile(2.0 ** np.arange(3, 35, 4), 5)
    return label_calls(ctx, sim, coll, nbytes, limits=limits, job=job), sim


def test_labels_are_consistent_with_the_simulator() -> None:
    data, sim = _label()
    assert data.obs.shape == (40, OBS_DIM)
    assert (data.best_time <= data.nccl_time * (1 + 1e-9)).all()
    assert np.isinf(data.times[~data.ap_mask]).all()
    assert np.isfinite(data.times[data.ap_mask]).all()
    # The NCCL pick's time is the simulator's time of it.
    i = 37
    a, p = divmod(int(data.nccl_ap[i]), 3)
    assert abs(data.times[i, a, p] - data.nccl_time[i]) <= 1e-9 * data.nccl_time[i]
    assert sim.system.ranks == 8


def test_constraints_mask_actions() -> None:
    data, _ = _label(ActionLimits(algos=frozenset({Algo.RING})))
    assert not data.ap_mask[:, Algo.TREE.nccl_id].any()
    assert data.ap_mask[:, Algo.RING.nccl_id].any(axis=-1).all()


def test_concat_and_subset() -> None:
    a, _ = _label(job=0)
    b, _ = _label(job=1)
    both = concat([a, b])
    assert len(both) == 80
    assert set(both.job.tolist()) == {0, 1}
    part = subset(both, np.array([0, 79]))
    assert len(part) == 2
    assert part.job.tolist() == [0, 1]

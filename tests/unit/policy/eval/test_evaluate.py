"""Evaluation metrics: NCCL's own choice scores 1x, the oracle scores 100 %."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynamiccl.api.topology import parse_topology
from dynamiccl.policy.eval.evaluate import action_times, metrics
from dynamiccl.policy.runtime.encode import JobContext
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.train.dataset import label_calls

H200_5: dict[str, Any] = {
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


def test_nccl_and_oracle_reference_points() -> None:
    ctx = JobContext.of(parse_topology(H200_5))
    sim = Simulator(ctx.system)
    data = label_calls(
        ctx, sim, np.full(24, 4), np.asarray(2.0 ** np.arange(11, 35), dtype=np.float64)
    )
    n = len(data)
    nccl_acts = np.zeros((n, 4), dtype=np.int64)
    nccl_acts[:, 0], nccl_acts[:, 1] = np.divmod(data.nccl_ap, 3)
    m = metrics(data, action_times([sim], data, nccl_acts))
    assert abs(m.speedup - 1.0) < 1e-9
    assert m.worst_speedup > 0.999
    assert m.differ_calls > 0  # NVLS beats NCCL's Ring on 5 Hopper GPUs (departure)
    assert m.differ_oracle_speedup is not None
    assert m.differ_oracle_speedup > 1.01
    best = np.zeros((n, 4), dtype=np.int64)
    best[:, 0], best[:, 1] = np.divmod(data.best_ap, 3)
    mo = metrics(data, action_times([sim], data, best))
    assert abs(mo.oracle_fraction - 1.0) < 1e-9
    assert mo.differ_speedup is not None
    assert abs(mo.differ_speedup - m.differ_oracle_speedup) < 1e-9
    assert mo.speedup > 1.0
    assert mo.below_default_2pct == 0

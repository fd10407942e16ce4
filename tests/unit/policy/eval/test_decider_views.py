"""What a job's Decider says about a surface's rows (policy/eval/decider_views.py)."""

from __future__ import annotations

import math

from dynamiccl.api.nccl import Collective
from dynamiccl.api.topology import parse_topology
from dynamiccl.policy.eval.decider_views import nccl_estimate
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.train.inference import Policy
from tests.unit.policy.eval.test_bench_tune import TOPOLOGIES


def test_nccls_estimate_is_the_model_nccls_own_pick_comes_from() -> None:
    """Every pair NCCL can run, with a finite positive time; NCCL's own pick is the pair
    its estimate puts lowest (what the sidecar's probes measure the reach from)."""
    for name in ("h200x5", "p5x2"):
        decider = Decider.of(Policy.load(), parse_topology(TOPOLOGIES[name]))
        estimate = nccl_estimate(decider)
        for coll in (Collective.ALLREDUCE, Collective.ALLGATHER):
            for nbytes in (1 << 10, 1 << 20, 1 << 30):
                est = estimate(coll, nbytes)
                assert len(est) >= 2
                assert all(math.isfinite(t) and t > 0 for t in est.values())
                pick = decider.nccl_choice(coll, nbytes)
                assert min(est, key=lambda p: est[p]) == (pick.algo, pick.proto), (name, nbytes)

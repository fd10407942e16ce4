"""Simulator throughput: evaluations per second, scalar and batch.

Reproduce:  .venv/bin/python benchmarks/sim_bench.py [--json]

Measures, on the 8x H200 calibration system:
- scalar  `Simulator.predict` (one call, NCCL's pick resolved, anchored, busbw)
- batch   `Simulator.times` over N random (collective, size, algo, proto, nch) rows
- batch   `Simulator.sample` (same, with seeded noise)
- baseline in the same run: NCCL's own cost model alone (`NcclModel.pick`), the
  cheapest thing the simulator must do per row; the ratio says what the
  physics + anchoring costs on top.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from dynamiccl.api.nccl import Collective
from dynamiccl.policy.sim.calibration_data import calibration_system
from dynamiccl.policy.sim.simulator import Simulator


def rate(fn: Callable[[], object], per_call: int, min_seconds: float = 1.0) -> float:
    """Rows per second of `fn` (each call evaluates `per_call` rows); best of 3 runs."""
    best = 0.0
    for _ in range(3):
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < min_seconds / 3:
            fn()
            n += 1
        best = max(best, n * per_call / elapsed)
    return best


def main() -> dict[str, float]:
    sim = Simulator(calibration_system("dgx-h200"))
    rng = np.random.default_rng(0)
    results: dict[str, float] = {}
    results["scalar_predict_per_s"] = rate(lambda: sim.predict(Collective.ALLREDUCE, 1 << 20), 1)
    for n in (1_000, 100_000):
        coll = rng.integers(0, 5, n)
        size = (2.0 ** rng.uniform(3, 34, n)).astype(np.int64)
        algo = rng.integers(0, 7, n)
        proto = rng.integers(0, 3, n)
        nch = rng.choice([0, 1, 2, 4, 8, 16, 24], n)
        results[f"batch_times_{n}_rows_per_s"] = rate(
            partial(sim.times, coll, size, algo, proto, nch=nch), n
        )
        results[f"batch_sample_{n}_rows_per_s"] = rate(
            partial(sim.sample, coll, size, algo, proto, nch=nch, seed=1), n
        )
        results[f"baseline_nccl_pick_{n}_rows_per_s"] = rate(partial(sim.nccl.pick, coll, size), n)
        results[f"batch_vs_baseline_{n}_ratio"] = (
            results[f"batch_times_{n}_rows_per_s"] / results[f"baseline_nccl_pick_{n}_rows_per_s"]
        )
    results["batch_vs_scalar_speedup"] = (
        results["batch_times_100000_rows_per_s"] / results["scalar_predict_per_s"]
    )
    return results


if __name__ == "__main__":
    out = main()
    if "--json" in sys.argv:
        print(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            print(f"{key:40s} {value:14,.1f}")

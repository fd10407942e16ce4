"""Compile-to-table latency: state features -> the plugin's decision table (target <= 20 ms).

Reproduce:  .venv/bin/python benchmarks/compile_bench.py [--json] [--plain-malloc]
            .venv/bin/python benchmarks/compile_bench.py --operator-only  (RUNS=30)

Measures, with the shipped default model (a seed ensemble), `compile_table`
for four jobs: one 8x H100 node; 4 nodes of 8x H100 on InfiniBand (world +
intra-node communicators); the same as a 3D-parallel job with tensor
parallelism 4, data parallelism 4, pipeline parallelism 2 (world, node, TP,
DP and PP communicators: 5 scale classes x 5 collectives x 33 size buckets,
8 B - 64 GiB = 825 cells ranked); TP=4 CP=2 PP=4 DP=8 on 32 nodes (7 scale
classes, 1155 cells). Two implementations:
- `operator`: what the operator runs, the torch-free `NumpyPolicy` with one
  BLAS thread (the chart sets OPENBLAS_NUM_THREADS=1, as this script does) and
  the chart's malloc thresholds (`malloc_as_operator`; `--plain-malloc`: glibc's
  defaults, which page-fault a compile's freed arrays back every time);
- `torch`: `inference.Policy`, torch on one thread (`policy decide`, training).
Baselines in the same run: the same compile by the first member alone (what
the ensemble's second opinion costs), one `DecisionTable.model_validate` of
the result (what any consumer pays to accept a table), and the bare network
forward pass over the same number of states. Reports the median and p90 wall
time and the median CPU time of 30 runs each (after 3 warm-up runs), all
measured functions interleaved round by round; on the
shared machine CPU time is the fair number.

`--operator-only` prints only the operator compile's median CPU ms per job and uses
only public API, so the same script measures an older checkout's package
(PYTHONPATH=<checkout>) for a before/after ratio on the same machine.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: as the operator runs


import numpy as np
import torch

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.topology import TopologySpec, parse_topology
from dynamiccl.policy.runtime.compile import BUCKETS, compile_table
from dynamiccl.policy.runtime.encode import OBS_DIM
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from dynamiccl.policy.runtime.ranker import Ranker
from dynamiccl.policy.train.inference import Policy

# The chart's MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ (templates/operator.yaml):
# glibc reads those only at process start, so this process sets them with mallopt.
MALLOC_MMAP_THRESHOLD: Final = 33554432
MALLOC_TRIM_THRESHOLD: Final = 67108864


def malloc_as_operator() -> bool:
    """Keep freed heap as the operator's chart does (False: not glibc, left alone)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(-3, MALLOC_MMAP_THRESHOLD) and libc.mallopt(-1, MALLOC_TRIM_THRESHOLD))


NODE: dict[str, Any] = {
    "name": "h100",
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


def timed(fns: dict[str, Callable[[], object]], runs: int = 30) -> dict[str, tuple[float, ...]]:
    """Per function: (median wall ms, p90 wall ms, median CPU ms of this process).

    The functions run interleaved, one call each per round, so a slow spell
    on the shared machine hits all of them alike and their ratios stay fair.
    Wall time includes waiting for a core, CPU time does not; both are
    reported.
    """
    for _ in range(3):
        for fn in fns.values():
            fn()
    ms: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            ms[k].append((time.perf_counter() - t) * 1e3)
            cpu[k].append((time.process_time() - c) * 1e3)
    out: dict[str, tuple[float, ...]] = {}
    for k in fns:
        wall = sorted(ms[k])
        p90 = wall[int(0.9 * (len(wall) - 1))]
        out[k] = (statistics.median(wall), p90, statistics.median(cpu[k]))
    return out


def _jobs() -> dict[str, TopologySpec | StateFeatures]:
    multi = {**NODE, "nodes": 4}
    three_d = StateFeatures.model_validate(
        {
            "world_size": 32,
            "gpus_per_pod": 8,
            "replicas": 4,
            "nproc_per_node": 8,
            "topology": {
                **multi,
                "tier_max": "same_rack",
                "tier_mix": {"same_rack": 1.0, "same_node": 0.0},
            },
            "workload": {"parallelism": "3d", "degrees": {"dp": 4, "tp": 4, "pp": 2}},
        }
    )
    cp_job = StateFeatures.model_validate(
        {
            "world_size": 256,
            "gpus_per_pod": 8,
            "replicas": 32,
            "nproc_per_node": 8,
            "topology": {
                **NODE,
                "nodes": 32,
                "tier_max": "same_rack",
                "tier_mix": {"same_rack": 1.0, "same_node": 0.0},
            },
            "workload": {"parallelism": "3d", "degrees": {"tp": 4, "cp": 2, "pp": 4, "dp": 8}},
        }
    )
    return {
        "1 node 8x H100": parse_topology(NODE),
        "4 nodes 8x H100 IB": parse_topology(multi),
        "4 nodes, 3D parallel (tp 4)": three_d,
        "32 nodes, tp 4 cp 2 pp 4 dp 8": cp_job,
    }


def operator_only(runs: int) -> dict[str, Any]:
    """CPU ms median of the operator's compile per job, nothing else (`--operator-only`:
    quick, and only public API, so it also runs against an older checkout's package)."""
    npp = NumpyPolicy.load()
    fns: dict[str, Callable[[], object]] = {
        name: partial(compile_table, npp, job) for name, job in _jobs().items()
    }
    t = timed(fns, runs)
    return {name: round(t[name][2], 2) for name in fns}


def main(malloc: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    pol = Policy.load()
    jobs = _jobs()
    npp = NumpyPolicy.load()
    impls: dict[str, tuple[Ranker, Ranker]] = {
        "operator": (npp, NumpyPolicy(npp.config, npp.w, meta=npp.meta)),
        "torch": (pol, Policy(net=pol.net, meta=pol.meta)),
    }
    out: dict[str, Any] = {
        "target_ms": 20.0,
        "members": 1 + len(pol.peers),
        "chart_malloc": malloc,
        "jobs": {},
    }
    for name, job in jobs.items():
        table = compile_table(npp, job)
        states = len(table.scales) * 5 * len(BUCKETS)
        obs = np.random.default_rng(0).random((states, OBS_DIM)).astype(np.float32)
        fns: dict[str, Callable[[], object]] = {
            "validate": partial(DecisionTable.model_validate, table.model_dump(mode="json")),
            "forward": partial(torch.no_grad()(pol._h), obs),
        }
        for impl, (model, first) in impls.items():
            fns[impl] = partial(compile_table, model, job)
            fns[impl + "/first"] = partial(compile_table, first, job)
        t = timed(fns)
        row: dict[str, Any] = {
            impl: {
                "compile_ms_median": round(t[impl][0], 2),
                "compile_ms_p90": round(t[impl][1], 2),
                "compile_cpu_ms_median": round(t[impl][2], 2),
                "first_member_cpu_ms_median": round(t[impl + "/first"][2], 2),
            }
            for impl in impls
        }
        vcpu, fcpu = t["validate"][2], t["forward"][2]
        cpu = row["operator"]["compile_cpu_ms_median"]
        out["jobs"][name] = {
            **row,
            "cells": len(table.cells),
            "scales": len(table.scales),
            "states_ranked": states,
            "baseline_validate_cpu_ms": round(vcpu, 2),
            "baseline_forward_cpu_ms": round(fcpu, 2),
            "ratio_vs_validate": round(cpu / max(vcpu, 1e-6), 2),
            "within_target": cpu <= 20.0,
        }
    return out


if __name__ == "__main__":
    MALLOC = "--plain-malloc" not in sys.argv and malloc_as_operator()
    if "--operator-only" in sys.argv:
        res = operator_only(int(os.environ.get("RUNS", "30")))
        print(json.dumps({**res, "chart_malloc": MALLOC}))
        sys.exit(0)
    res = main(MALLOC)
    if "--json" in sys.argv:
        print(json.dumps(res, indent=2))
    else:
        head = "CPU ms median (first member alone), wall median / p90"
        print(f"{res['members']}-member model, chart malloc {res['chart_malloc']}; {head}")
        for name, r in res["jobs"].items():
            cols = [
                f"{impl} {x['compile_cpu_ms_median']:5.2f}"
                f" ({x['first_member_cpu_ms_median']:5.2f}),"
                f" {x['compile_ms_median']:.2f} / {x['compile_ms_p90']:.2f}"
                for impl, x in ((i, r[i]) for i in ("operator", "torch"))
            ]
            print(
                f"{name:<28} {r['cells']} cells, {r['scales']} scales; {'; '.join(cols)};"
                f" validate-only {r['baseline_validate_cpu_ms']:.2f}, forward-only"
                f" {r['baseline_forward_cpu_ms']:.2f}; within 20 ms: {r['within_target']}"
            )

"""Scale classes of large jobs (issue 33.1): cells per job size, table size, NCCL's choice.

    .venv/bin/python benchmarks/scale_classes_bench.py
    git archive <commit before issue 33.1> | tar -x -C /tmp/old
    .venv/bin/python benchmarks/scale_classes_bench.py --compare /tmp/old [--json]

For jobs of 128, 1 024 and 12 000 DGX H100 nodes (8 GPUs each; TP 8, PP 4, DP the rest,
across racks), each run through the product's own code of a checkout (this one, and with
`--compare TREE` another one, in a fresh interpreter with that tree's `dynamiccl` first on
sys.path):

- the scale class of every communicator the job's parallelism implies (`coverage` of
  policy/runtime/compile.py) and whether the compiled table has cells for it;
- the operator's ConfigMap for the job (operator/controller/configmap.py `build`, the shipped
  model, the default NCCLTuningPolicy): its table's scale classes, cells, and bytes (the
  table's JSON and the whole ConfigMap's data, against the 1 MiB an object may hold);
- which of the three jobs' world communicators share one scale class (and so one set of
  cells in the plugin: the same decisions for different sizes).

Then, from this checkout only, what NCCL's own cost model (policy/sim/nccl_model.py, the
simulator's re-implementation of NCCL's src/graph/tuning.cc) picks for the world
communicator's AllReduce, AllGather and ReduceScatter at 1 MiB, 64 MiB and 1 GiB, with
the modelled time of Ring and Tree (Simple) beside it: tree latency grows with
log2(nodes), ring latency with nodes. Nothing here runs NCCL: no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SCALE_BENCH_TREE", str(ROOT)))  # --compare: another tree

NODES: Final = (128, 1024, 12000)
SIZES: Final = (1 << 20, 1 << 26, 1 << 30)
COLLS: Final = ("allreduce", "allgather", "reducescatter")
CONFIG_MAP_LIMIT: Final = 1 << 20


def job(nodes: int) -> dict[str, Any]:
    """State features of a `nodes`-node DGX H100 job: TP 8 in a node, PP 4, DP the rest."""
    return {
        "world_size": 8 * nodes,
        "gpus_per_pod": 8,
        "replicas": nodes,
        "nproc_per_node": 8,
        "topology": {
            "name": "dgx-h100",
            "gpu": "H100",
            "gpus_per_node": 8,
            "nodes": nodes,
            "intra": "nvswitch",
            "nvlink_GBps": 450.0,
            "nvls": True,
            "pcie_gen": 5,
            "nics_per_node": 8,
            "nic_Gbps": 400.0,
            "fabric": "infiniband",
            "sharp": False,
            "tier_max": "cross_rack",
            "tier_mix": {"same_node": 0.0, "same_rack": 0.1, "cross_rack": 0.9},
        },
        "workload": {"parallelism": "3d", "degrees": {"tp": 8, "pp": 4, "dp": nodes // 4}},
    }


def one_tree() -> dict[str, Any]:
    """This interpreter's tree: per job size, its communicators and its ConfigMap's table."""
    from dynamiccl.api.features import StateFeatures  # noqa: PLC0415 - after sys.path
    from dynamiccl.api.table import scale_class  # noqa: PLC0415
    from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec  # noqa: PLC0415
    from dynamiccl.operator.controller import configmap as cm  # noqa: PLC0415
    from dynamiccl.policy.runtime.compile import coverage  # noqa: PLC0415

    out: dict[str, Any] = {"tree": sys.path[0], "jobs": []}
    ref = cm.JobRef("kubeflow.org/v1", "PyTorchJob", "big", "team-a", "uid-1")
    for nodes in NODES:
        f = StateFeatures.model_validate(job(nodes))
        obj = cm.build(
            ref, f, "default", NCCLTuningPolicySpec(), model_version="default", canary=False
        )
        table = json.loads(obj["data"][cm.KEY_TABLE])
        out["jobs"].append(
            {
                "nodes": nodes,
                "world_scale": scale_class(8 * nodes, nodes),
                "communicators": [
                    {"group": g, "nranks": n, "nnodes": k, "scale": s, "compiled": c}
                    for g, n, k, s, c in coverage(f)
                ],
                "table_scales": table.get("scales", []),
                "table_cells": len(table.get("cells", [])),
                "table_bytes": len(obj["data"][cm.KEY_TABLE]),
                "config_map_bytes": sum(len(v) for v in obj["data"].values()),
            }
        )
    return out


def nccl_choices() -> list[dict[str, Any]]:
    """NCCL's modelled pick for each job's world communicator (this tree only)."""
    from dynamiccl.api.features import StateFeatures  # noqa: PLC0415
    from dynamiccl.api.nccl import Algo, Collective, Proto  # noqa: PLC0415
    from dynamiccl.policy.runtime.encode import JobContext  # noqa: PLC0415
    from dynamiccl.policy.sim.nccl_model import NcclModel  # noqa: PLC0415

    rows = []
    for nodes in NODES:
        model = NcclModel(JobContext.of(StateFeatures.model_validate(job(nodes))).system)
        for name in COLLS:
            coll = Collective(name)
            for size in SIZES:
                pick = model.choose(coll, size)
                times = model.times([coll.nccl_id], [size])[0]  # [algo][proto] in us
                simple = list(Proto).index(Proto.SIMPLE)
                rows.append(
                    {
                        "nodes": nodes,
                        "collective": name,
                        "bytes": size,
                        "algo": pick.algo.value,
                        "proto": pick.proto.value,
                        "ring_simple_us": float(times[list(Algo).index(Algo.RING)][simple]),
                        "tree_simple_us": float(times[list(Algo).index(Algo.TREE)][simple]),
                    }
                )
    return rows


def run_tree(tree: str) -> dict[str, Any]:
    env = {**os.environ, "SCALE_BENCH_TREE": tree}
    done = subprocess.run(
        [sys.executable, __file__, "--run-one"], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def shared_worlds(tree: dict[str, Any]) -> list[list[int]]:
    """Groups of job sizes whose world communicators fall into one scale class."""
    by: dict[int, list[int]] = {}
    for j in tree["jobs"]:
        by.setdefault(j["world_scale"], []).append(j["nodes"])
    return [v for v in by.values() if len(v) > 1]


def show(label: str, tree: dict[str, Any]) -> None:
    print(f"== {label}: {tree['tree']}")
    print(
        f"{'nodes':>6} {'world class':>11} {'table classes':<22} {'cells':>6} "
        f"{'table B':>9} {'ConfigMap B':>11}  communicators (group ranks/nodes class: cells?)"
    )
    for j in tree["jobs"]:
        comms = ", ".join(
            f"{c['group']} {c['nranks']}/{c['nnodes']} {c['scale']}:{'y' if c['compiled'] else 'n'}"
            for c in j["communicators"]
        )
        print(
            f"{j['nodes']:>6} {j['world_scale']:>11} {j['table_scales']!s:<22} "
            f"{j['table_cells']:>6} {j['table_bytes']:>9} {j['config_map_bytes']:>11}  {comms}"
        )
    shared = shared_worlds(tree)
    print(
        "world communicators sharing one scale class (one set of cells): "
        + ("; ".join(" and ".join(f"{n} nodes" for n in g) for g in shared) or "none")
    )


def show_nccl(rows: list[dict[str, Any]]) -> None:
    print("== NCCL's own choice (policy/sim/nccl_model.py) for the world communicator")
    print(
        f"{'nodes':>6} {'collective':<14} {'bytes':>11} {'pick':<16} "
        f"{'ring us':>10} {'tree us':>10}"
    )
    for r in rows:
        tree = f"{r['tree_simple_us']:>10.1f}" if r["tree_simple_us"] < 1e30 else f"{'-':>10}"
        print(
            f"{r['nodes']:>6} {r['collective']:<14} {r['bytes']:>11} "
            f"{r['algo'] + '/' + r['proto']:<16} {r['ring_simple_us']:>10.1f} {tree}"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--run-one":
        sys.stdout.write(json.dumps(one_tree()))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compare", help="another checkout's root (e.g. before issue 33.1)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    doc: dict[str, Any] = {"this": run_tree(str(ROOT)), "nccl": nccl_choices()}
    if a.compare:
        doc["compare"] = run_tree(a.compare)
    doc["config_map_limit"] = CONFIG_MAP_LIMIT
    if a.json:
        print(json.dumps(doc, indent=1))
        return
    if a.compare:
        show("compare", doc["compare"])
    show("this", doc["this"])
    show_nccl(doc["nccl"])


if __name__ == "__main__":
    main()

"""Golden compile-to-table outputs: jobs, models and specs whose tables must never change
by a speed-up of the compile (test_compile_golden.py checks them).

Regenerate (only when a change is *meant* to change tables, and say so in the commit):

    .venv/bin/python -m tests.unit.policy.runtime.compile_golden

It writes compile_golden.json next to this file: per case the SHA-256 of the table's JSON
(`DecisionTable.model_dump_json()`, what the operator ships in the job's ConfigMap) and of
the same table after `exploration.assign` with a class coverage derived from it. The
recorded digests of 2026-11-25 were written by the code before the batched compile
(commit eb29c8a), so the test shows the batched compile's tables are byte-identical.

The digests are of float results, and numpy's transcendental kernels (exp, tanh) differ in
the last bits between x86 SIMD levels, so a near-tie can rank differently on an AVX-512
(X86_V4) and an AVX2-only (X86_V3) machine. The recorded digests are X86_V4's; where an
X86_V3 machine's compile differs, its digests are recorded under `cpu_overrides` by

    .venv/bin/python -m tests.unit.policy.runtime.compile_golden --cpu-overrides

run on such a machine (only the cases that differ; say so in the commit).

Issue 33.1 renumbered the scale classes (32 -> 128). `digest` hashes a table in the old
numbering, and every recorded table digest still matched on X86_V3 (all 84 cases): the
renumbering only relabels cells. The exploration assignment rotates each cell's window by a
hash that includes its scale class number, so the `assigned_*` digests were re-recorded, on
an X86_V3 machine. For the one case whose X86_V4 table differs from X86_V3's (see
`cpu_overrides`), X86_V4's new assignment digest is unknown (no such machine was at hand):
it was recorded as null, and that one check skipped on X86_V4, until 2026-12-02: an Intel
X86_V4 machine compiles the base table there, and its two assignment digests are now the
base's (the fresh one the base had carried, X86_V3's, moved into X86_V3's overrides). Every
case now has every digest, so the test checks them all and skips none.

Models: random networks of the shipped layout from fixed seeds (`RandomState`, whose
stream numpy keeps frozen), three members each so the ensemble's second opinion runs,
with differently scaled heads (hundreds of cells whose first choice departs from NCCL's);
and the shipped model, checked only while its file is the one the digests were made with.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.learning import CellCoverage, ClassCoverage, Finding, MeasuredConfig
from dynamiccl.api.table import PPN_CLASS_MAX, DecisionTable
from dynamiccl.api.topology import TopologySpec, parse_topology
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.runtime.compile import compile_table
from dynamiccl.policy.runtime.encode import OBS_DIM, PICK_ALGO_OFFSET, PICK_PROTO_OFFSET
from dynamiccl.policy.runtime.exploration import assign
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ, file_sha256
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from tests.topology_samples import dgx_h100

GOLDEN: Final = Path(__file__).with_name("compile_golden.json")
HEADS: Final = (7, 3, 9, 8)


def random_member(seed: int, pick_gain: float, head_gain: float) -> NumpyPolicy:
    """A network of the shipped layout (hidden 32, embeddings 8) with seeded weights."""
    rs = np.random.RandomState(seed)
    h, e = 32, 8
    a_n, p_n, c_n, k_n = HEADS
    shapes = {
        "encoder.0": (h, OBS_DIM + sum(HEADS) + 1),
        "encoder.2": (h, h),
        "post.0": (h, 2 * h),
        "head_algo": (a_n, h),
        "head_proto": (p_n, h + e),
        "head_ch": (c_n, h + 2 * e),
        "head_chunk": (k_n, h + 3 * e),
    }
    w: dict[str, Any] = {}
    for name, (rows, cols) in shapes.items():
        gain = head_gain if name.startswith("head") else 1.5
        w[name + ".weight"] = rs.standard_normal((rows, cols)) * gain / np.sqrt(cols)
        w[name + ".bias"] = rs.standard_normal(rows) * 0.1
    w["lstm.weight_ih_l0"] = rs.standard_normal((4 * h, h)) / np.sqrt(h)
    w["lstm.weight_hh_l0"] = np.zeros((4 * h, h))
    w["lstm.bias_ih_l0"] = rs.standard_normal(4 * h) * 0.1
    w["lstm.bias_hh_l0"] = rs.standard_normal(4 * h) * 0.1
    for name, n in (("algo", a_n), ("proto", p_n), ("ch", c_n)):
        w[f"emb_{name}.weight"] = rs.standard_normal((n, e))
    w["pick_gain"] = np.array([pick_gain, pick_gain])
    config = {
        "emb": e,
        "heads": list(HEADS),
        "hidden": h,
        "obs_dim": OBS_DIM,
        "pick_offsets": [PICK_ALGO_OFFSET, PICK_PROTO_OFFSET],
    }
    return NumpyPolicy(config, w)


def random_model(seed: int, pick_gain: float, head_gain: float) -> NumpyPolicy:
    """Three seeded members; the first decides, deviating at confidence >= 0.5."""
    first, *peers = (random_member(seed + i, pick_gain, head_gain) for i in range(3))
    meta = {"config": {"deviate_confidence": 0.5}}
    return NumpyPolicy(first.config, first.w, meta=meta, peers=peers)


MODELS: Final[dict[str, Callable[[], NumpyPolicy]]] = {
    "random-a": lambda: random_model(11, 6.0, 4.0),
    "random-b": lambda: random_model(23, 0.5, 6.0),
    "shipped": NumpyPolicy.load,
}


def _features(topo: dict[str, Any], pods: int, per_pod: int, **workload: Any) -> StateFeatures:
    multi = topo["nodes"] > 1
    return StateFeatures.model_validate(
        {
            "world_size": pods * per_pod,
            "gpus_per_pod": per_pod,
            "replicas": pods,
            "nproc_per_node": per_pod,
            "topology": {
                **topo,
                "tier_max": "same_rack" if multi else "same_node",
                "tier_mix": {"same_rack": 1.0, "same_node": 0.0} if multi else {},
            },
            "workload": workload,
            "environment": {"container_boundary": per_pod < topo["gpus_per_node"]},
        }
    )


def jobs() -> dict[str, TopologySpec | StateFeatures]:
    """Topologies and shapes: 1 to 8 scale classes, NVSwitch, PCIe, EFA, containers."""
    pcie = dgx_h100("a100-pcie", 2, gpu="A100", intra="pcie", nvlink_GBps=0, nvls=False)
    pcie |= {"pcie_gen": 4, "nics_per_node": 2, "nic_Gbps": 200, "fabric": "roce"}
    efa = dgx_h100("p5", 2, nics_per_node=32, nic_Gbps=100, fabric="efa")
    return {
        "1 node (spec)": parse_topology(dgx_h100("h100", 1)),
        "4 nodes (spec)": parse_topology(dgx_h100("h100", 4)),
        "3d tp4 dp4 pp2 on 4x8": _features(
            dgx_h100("h100", 4), 4, 8, parallelism="3d", degrees={"tp": 4, "dp": 4, "pp": 2}
        ),
        "3d tp4 cp2 pp4 dp8 on 32x8": _features(
            dgx_h100("h100", 32),
            32,
            8,
            parallelism="3d",
            degrees={"tp": 4, "cp": 2, "pp": 4, "dp": 8},
        ),
        "moe tp2 ep4 pp2 on 16x8": _features(
            dgx_h100("h100", 16), 16, 8, parallelism="moe", degrees={"tp": 2, "ep": 4, "pp": 2}
        ),
        "tp2 pp2 on 2 pcie nodes": _features(
            pcie, 2, 8, parallelism="3d", degrees={"tp": 2, "pp": 2, "dp": 4}
        ),
        "dp on 2 efa nodes, 4-GPU pods": _features(efa, 4, 4, parallelism="dp"),
    }


SPECS: Final[dict[str, dict[str, Any]]] = {
    "learned": {},
    "learned 2 candidates": {"exploration": {"maxCandidates": 2, "budgetCalls": 5000}},
    "static": {"mode": "static"},
    "constrained": {
        "mode": "learned",
        "constraints": {
            "allowedAlgorithms": ["ring", "tree", "nvls"],
            "allowedProtocols": ["simple", "ll128"],
            "channels": {"min": 4, "max": 32},
            "chunkBytes": {"min": 131072, "max": 4194304},
        },
    },
}


def coverage_of(table: DecisionTable) -> ClassCoverage:
    """A class coverage derived from a table: some cells' candidates measured, some departed
    (each departure confirmed by two jobs: a holding finding, issue 29)."""
    cells, found = [], []
    for i, cell in enumerate(c for c in table.cells if c.candidates):
        if i % 3:
            continue
        measured = [
            MeasuredConfig(
                algo=x.algo.value,
                proto=x.proto.value,
                nchannels=x.nchannels,
                chunk_bytes=x.chunk_bytes,
                calls=32,
                jobs=1,
                speedup=1.2 if i % 9 == 0 and j == 0 else 0.9,
            )
            for j, x in enumerate(cell.candidates[: 1 + i % 4])
        ]
        node_class, ppn_class = divmod(cell.scale, PPN_CLASS_MAX + 1)
        cells.append(
            CellCoverage(
                collective=cell.collective.value,
                size_bucket=cell.bucket,
                nranks=2**ppn_class * 2**node_class,
                nnodes=2**node_class,
                measured=measured,
            )
        )
        found += [
            Finding(**m.model_dump(include={"algo", "proto", "nchannels", "chunk_bytes"}),
                    **cells[-1].model_dump(include={"collective", "size_bucket", "nranks",
                                                    "nnodes"}),
                    speedup=m.speedup, supporting=2, namespaces=1, holds=True)
            for m in measured if m.is_departure and len(cells) <= 256
        ]  # fmt: skip
    return ClassCoverage(hardware_class="golden", cells=cells[:256], findings=found[:128])


def digest(table: DecisionTable) -> str:
    """SHA-256 of the table's JSON as the code of the recorded digests wrote it: scale classes
    numbered node class * 4 + ranks-per-node class (32 classes) and no `scale_encoding`. The
    renumbering to 128 classes (issue 33) is a relabelling of the same cells; every golden job
    is within the old classes (at most 128 nodes and 8 ranks per node)."""
    old = {}
    for s in table.scales:
        node_class, ppn_class = divmod(s, PPN_CLASS_MAX + 1)
        assert node_class <= 7 and ppn_class <= 3, f"scale class {s} has no 32-class number"  # noqa: PT018
        old[s] = node_class * 4 + ppn_class
    recorded = table.model_copy(
        update={
            "scales": tuple(old[s] for s in table.scales),
            "cells": tuple(c.model_copy(update={"scale": old[c.scale]}) for c in table.cells),
        }
    )
    blob = recorded.model_dump_json(exclude={"scale_encoding"})
    return hashlib.sha256(blob.encode()).hexdigest()


def case_digests(model: NumpyPolicy) -> dict[str, dict[str, Any]]:
    """Per (job, spec): cells, digest of the table and of two exploration assignments."""
    out: dict[str, dict[str, Any]] = {}
    for job_name, job in jobs().items():
        for spec_name, spec in SPECS.items():
            table = compile_table(model, job, NCCLTuningPolicySpec.model_validate(spec))
            cov = coverage_of(table)
            out[f"{job_name} / {spec_name}"] = {
                "cells": len(table.cells),
                "table": digest(table),
                "assigned_fresh": digest(assign(table, None, "job-a").table),
                "assigned_covered": digest(assign(table, cov, "job-b", 5000).table),
            }
    return out


def cpu_class() -> str:
    """numpy's widest x86 SIMD level here ("X86_V4": AVX-512; "X86_V3": AVX2; else "other")."""
    features: dict[str, bool] = importlib.import_module(
        "numpy._core._multiarray_umath"
    ).__cpu_features__  # numpy's runtime dispatch table (what np.show_runtime() prints)
    for level in ("X86_V4", "X86_V3"):
        if features.get(level):
            return level
    return "other"


def outcomes(golden: dict[str, Any], model: str, case: str) -> list[dict[str, Any]]:
    """The recorded digests of a case: the base record, then one per CPU class that
    recorded another outcome (its overrides on the base). A near-tie can rank either way
    with the last bits of numpy's SIMD kernels, and the class numpy reports does not
    decide it: an AMD EPYC with AVX-512 (X86_V4) compiles the X86_V3 outcome of the one
    such case (2026-11-29), where the base was recorded on another X86_V4 machine."""
    base: dict[str, Any] = golden["models"][model][case]
    overs = [
        {**base, **by_model[model][case]}
        for by_model in golden.get("cpu_overrides", {}).values()
        if case in by_model.get(model, {})
    ]
    return [base, *overs]


def cpu_overrides(golden: dict[str, Any]) -> dict[str, Any]:
    """This CPU class's digests where they differ from the recorded ones."""
    out: dict[str, Any] = {}
    for name, make in MODELS.items():
        for case, got in case_digests(make()).items():
            diff = {k: v for k, v in got.items() if golden["models"][name][case].get(k) != v}
            if diff:
                out.setdefault(name, {})[case] = diff
    return out


def generate() -> dict[str, Any]:
    return {
        "shipped_model_sha256": file_sha256(DEFAULT_NPZ),
        "models": {name: case_digests(make()) for name, make in MODELS.items()},
    }


if __name__ == "__main__":
    if "--cpu-overrides" in sys.argv:
        recorded = json.loads(GOLDEN.read_text())
        recorded.setdefault("cpu_overrides", {})[cpu_class()] = cpu_overrides(recorded)
    else:
        recorded = generate()
    GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {GOLDEN}\n")

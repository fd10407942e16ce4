"""`sidecar_bench.py --tuner`: the online tuner's own CPU per attributed call.

`Tuning.observe` with the sidecar's configuration on the bench's table
(sidecar_workload.py), each call taking the configuration the cell's plan draws
for the plugin's call counter; process CPU time over `calls` calls in a fresh
interpreter per run (`sidecar_bench.py --tuner-run`), best of `repeats`; with a
compare tree, the runs of both trees interleaved and their ratio.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sidecar_workload import COLLS, NNODES, NRANKS, SIZES, write_config

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Proto
from dynamiccl.api.table import DecisionTable, scale_class

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BENCH = HERE / "sidecar_bench.py"
# calls between two of the leader's coordination steps, each of which asks whether an early
# round is due (`Tuning.escape_due`): a 0.5 s step at the bench's 10 000 calls/s
STEP_CALLS = 5000


def tuner_cpu(calls: int) -> float:
    """CPU seconds per call of `Tuning.observe` (run in a fresh interpreter: `--tuner-run`)."""
    from dynamiccl.policy.online.tuner import TunerConfig  # noqa: PLC0415
    from dynamiccl.sidecar.baseline import NcclDefaults  # noqa: PLC0415
    from dynamiccl.sidecar.tuning import Tuning  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        write_config(Path(tmp))
        table = DecisionTable.model_validate_json((Path(tmp) / "table.json").read_text())
        feats = StateFeatures.model_validate_json((Path(tmp) / "features.json").read_text())
    # AgentConfig.tuner() for this bench's policy: a 16-call epoch per table round, each
    # round 64 calls of every cell (--compare with a tree before rounds: 64-call epochs)
    rounds = "rounds" in {f.name for f in dataclasses.fields(Tuning)}
    cfg = TunerConfig.model_validate(
        {"refine": 0.5, "budget_calls": 1_000_000, "epoch_calls": 16 if rounds else 64}
    )
    extra: dict[str, Any] = {"rounds": True} if rounds else {}
    if cfg.race is not None and "probe_pairs" in type(cfg.race).model_fields:  # --compare: older
        cfg = cfg.model_copy(update={"race": cfg.race.model_copy(update={"probe_pairs": True})})
        extra["allowed_pairs"] = frozenset((a.nccl_id, p.nccl_id) for a in Algo for p in Proto)
    t = Tuning(table, cfg, NcclDefaults(feats), True, (1, 64), **extra)
    escapes = rounds and hasattr(t, "escape_due")  # --compare: a tree before early rounds
    rng = random.Random(3)
    sc = scale_class(NRANKS, NNODES)
    cells = [(c, n.bit_length() - 1, n) for c in COLLS for n in SIZES]
    counter = dict.fromkeys(cells, 0)
    t.observe(sc, 4, 20, NRANKS, NNODES, (1, 1, 0, 0), 10.0)  # warm the caches
    t0 = time.process_time()
    for i in range(calls):
        if rounds and i and i % (64 * len(cells)) == 0:
            t.end_round()  # the proposer's, once per round
        elif escapes and i and i % STEP_CALLS == 0 and t.escape_due():
            t.end_round(stretch=6.0)  # the leader's early round (table_changes._escape_due)
        cell = cells[i % len(cells)]
        ct = t.cells.get((sc, cell[0], cell[1]))
        j = counter[cell]
        counter[cell] = j + 1
        arm = ct.arms[ct.tuner.arm_for_call(j)] if ct is not None else (1, 1, 0, 0)
        base = 10.0 + cell[2] / 200 * (1 + 0.1 * arm[1]) * (1 + 0.01 * (arm[2] % 7))
        t.observe(sc, cell[0], cell[1], NRANKS, NNODES, arm, base * rng.lognormvariate(0, 0.03))
    return (time.process_time() - t0) / calls


def tuner_main(calls: int, repeats: int, compare: str | None, as_json: bool) -> None:
    """Best-of-`repeats` CPU per call of this checkout's tuner (and `compare`'s)."""
    trees = {"this": str(ROOT)} | ({"compare": compare} if compare else {})
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, tree in trees.items():
            out = subprocess.run(
                [sys.executable, str(BENCH), "--tuner-run", str(calls)],
                env={**os.environ, "PYTHONPATH": tree, "SIDECAR_BENCH_TREE": tree},
                cwd=tree,
                capture_output=True,
                text=True,
                check=True,
            )
            us = float(out.stdout.strip().splitlines()[-1]) * 1e6
            best[name] = min(best.get(name, us), us)
    doc: dict[str, Any] = {"calls": calls, "repeats": repeats, "us_per_call": best}
    if compare:
        doc["compare_tree"] = compare
        doc["ratio_this_vs_compare"] = best["this"] / best["compare"]
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    for name, us in best.items():
        print(f"{name:>8} ({trees[name]}): {us:.2f} us CPU per attributed call")
    if compare:
        print(f"ratio this / compare: {doc['ratio_this_vs_compare']:.3f}")

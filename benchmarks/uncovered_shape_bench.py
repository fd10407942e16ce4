#!/usr/bin/env python3
"""A communicator shape no table covers, tuned online: calls to a learned table, speedup.

    PYTHONPATH=. .venv/bin/python benchmarks/uncovered_shape_bench.py \
        [--seeds 5] [--rounds 80] [--json]

The setup of tests/unit/sidecar/test_shapes_online.py, from
tests/unit/sidecar/uncovered_shape.py (hence PYTHONPATH=.): two pods, each one training
process holding the real plugin `.so` (ctypes, NCCL's call order) with two communicators
of 2 ranks over the job's 2 nodes (scale class 4, absent from the job's table), and a
complete sidecar each (`Runner`: rings, attribution, the online tuner, the epoch
protocol over file CAS). All-reduce calls of 1 MiB and 16 MiB alternate; one interval
(256 calls) per communicator per round. Stand-in surface: NCCL's cost table is the
policy package's model of NCCL for the shape, the measured time that model's estimate
with 3 % jitter, except NCCL's own pick, which runs 1.6x slower than NCCL estimates.

Reported per seed (the ranks' jitter): the calls per communicator until a
committed table carries a first choice other than NCCL's pick for both buckets,
the share of calls that ran neither NCCL's pick nor the final choice
(exploration), whether both ranks took the same decision at every call, and the
mean time over the last 4 intervals against NCCL's pick's mean (speedup).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.api.nccl import Collective
from tests.unit.sidecar.conftest import write_config
from tests.unit.sidecar.uncovered_shape import COMM_IDS, SIZES, Job, L, latest


def run(seed: int, rounds: int) -> dict[str, Any]:
    mp = pytest.MonkeyPatch()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        names = (f"llm-worker-a-{seed}", f"llm-worker-b-{seed}")
        job = Job(functools.partial(write_config, root / "config"), root, mp.setenv, names)
        surface, scale, ranks = job.surface, job.scale, job.ranks
        tuned_at = None
        for rnd in range(rounds):
            job.round()
            if tuned_at is None and job.tuned():
                tuned_at = (rnd + 1) * L
        table = latest(job.runners[0])
        job.close()
    mp.undo()
    agree = all(
        [(p.algo, p.proto, p.nchannels) for p in ranks[0].played[c]]
        == [(p.algo, p.proto, p.nchannels) for p in ranks[1].played[c]]
        for c in COMM_IDS
    )
    out: dict[str, Any] = {"seed": seed, "calls_to_learned_table": tuned_at, "ranks_agree": agree}
    for nbytes in SIZES:
        nccl = surface.pick(4, nbytes)
        cell = table.cell(Collective.ALLREDUCE, nbytes.bit_length() - 1, scale) if table else None
        first = (cell.choices[0].algo.nccl_id, cell.choices[0].proto.nccl_id) if cell else nccl
        calls = [p for c in COMM_IDS for p in ranks[0].played[c] if p.nbytes == nbytes]
        explored = sum((p.algo, p.proto) not in (nccl, first) for p in calls) / len(calls)
        tail = [p.time_us for c in COMM_IDS for p in ranks[0].played[c][-4 * L :]
                if p.nbytes == nbytes]  # fmt: skip
        out[f"{nbytes >> 20}MiB"] = {
            "nccl_pick": nccl,
            "learned": first,
            "explored_share": round(explored, 4),
            "speedup": round(surface.mean_us(4, nbytes, *nccl) / statistics.fmean(tail), 3),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [run(s, args.rounds) for s in range(args.seeds)]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        parts = [f"seed {r['seed']}: learned table after {r['calls_to_learned_table']} calls",
                 f"ranks agree {r['ranks_agree']}"]  # fmt: skip
        for nbytes in SIZES:
            b = r[f"{nbytes >> 20}MiB"]
            parts.append(
                f"{nbytes >> 20} MiB: NCCL {b['nccl_pick']} -> {b['learned']}, "
                f"explored {100 * b['explored_share']:.1f} %, speedup {b['speedup']:.3f}"
            )
        print("; ".join(parts))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A communicator shape no table covers, tuned online: calls to a learned table, speedup.

    .venv/bin/python benchmarks/uncovered_shape_bench.py [--seeds 5] [--rounds 80] [--json]

The setup of tests/unit/agent/test_shapes_online.py: two pods, each one training
process holding the real plugin `.so` (ctypes, NCCL's call order) with two
communicators of 2 ranks over the job's 2 nodes (scale class 4, absent from the
job's table), and a complete sidecar each (`Runner`: rings, attribution, the
online tuner, the epoch protocol over file CAS). All-reduce calls of 1 MiB and
16 MiB alternate; one interval (256 calls) per communicator per round. Stand-in
surface: NCCL's cost table is the policy package's model of NCCL for the shape,
the measured time that model's estimate with 3 % jitter, except NCCL's own pick,
which runs 1.6x slower than NCCL estimates.

Reported per seed (the ranks' jitter): the calls per communicator until a
committed table carries a first choice other than NCCL's pick for both buckets,
the share of calls that ran neither NCCL's pick nor the final choice
(exploration), whether both ranks took the same decision at every call, and the
mean time over the last 4 intervals against NCCL's pick's mean (speedup).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.agent.cas import FileCAS
from dynamiccl.agent.coordination import Backends
from dynamiccl.agent.coordinator import DirTableStore
from dynamiccl.api.nccl import Collective
from dynamiccl.api.table import scale_class
from tests.unit.agent.conftest import JOB, exploration, features
from tests.unit.agent.test_shapes_online import (
    COMM_IDS,
    NNODES,
    NRANKS,
    SIZES,
    L,
    Rank,
    Surface,
    _latest,
    _pod,
    _tuned,
)


def _config_dir(root: Path) -> Any:
    def make(**keys: Any) -> Path:
        d = root / "config"
        d.mkdir(exist_ok=True)
        content = {
            "job.json": JOB,
            "features.json": features().model_dump(mode="json"),
            "exploration.json": exploration(),
            **{k.replace("_", ".", 1): v for k, v in keys.items()},
        }
        for name, value in content.items():
            (d / name).write_text(json.dumps(value))
        return d

    return make


def run(seed: int, rounds: int) -> dict[str, Any]:
    surface = Surface()
    scale = scale_class(NRANKS, NNODES)
    mp = pytest.MonkeyPatch()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        coord = root / "coord"
        backends = Backends(
            FileCAS(coord / "record.json"),
            FileCAS(coord / "lease.json"),
            DirTableStore(coord / "t"),
        )
        ticks = itertools.count(0.0, 0.05)
        runners = [_pod(_config_dir(root), root, n, backends, lambda: next(ticks)) for n in "ab"]
        ranks = [Rank(root, f"{r.cfg.pod_name}-{seed}", r.cfg.shm_path, mp) for r in runners]
        tuned_at = None
        for rnd in range(rounds):
            for rank in ranks:
                rank.play(surface, L)
            for r in runners:
                r.drain_once()
            for _ in range(3):
                for r in runners:
                    assert r.coordination is not None
                    r.coordination.step()
            if tuned_at is None and all(_tuned(_latest(r), surface, scale) for r in runners):
                tuned_at = (rnd + 1) * L
        table = _latest(runners[0])
        for r in runners:
            r.close()
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

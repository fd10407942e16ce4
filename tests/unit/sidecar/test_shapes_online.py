"""A communicator shape no table covers is measured, tuned online and agreed on by every rank.

The job, its ranks and sidecars, and the stand-in response surface are uncovered_shape.py's
(shared with benchmarks/uncovered_shape_bench.py): the real plugin `.so` per rank through
ctypes, the real sidecars and their epoch protocol over file CAS backends; stand-in: NCCL's
costs from the policy package's model of NCCL, NCCL's own pick `NCCL_SLOWER` times slower.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from dynamiccl.api.nccl import Collective
from tests.unit.sidecar.conftest import ConfigDir, learned_table
from tests.unit.sidecar.uncovered_shape import COMM_IDS, NNODES, NRANKS, SIZES, Job, L, latest

MAX_ROUNDS = 120


def test_an_uncovered_shape_is_tuned_online_and_every_rank_takes_the_same_decision(
    config_dir: ConfigDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = Job(config_dir, tmp_path, monkeypatch.setenv)
    surface, scale, runners, ranks = job.surface, job.scale, job.runners, job.ranks
    assert scale not in learned_table(8, 2).scales  # the job's table does not cover the shape
    done_at = None
    for rnd in range(MAX_ROUNDS):
        job.round()
        if done_at is None and job.tuned():
            done_at = rnd
        if done_at is not None and rnd >= done_at + 12:  # past the new table's boundary
            break
    summaries = [r.summary() for r in runners]
    job.close()
    assert done_at is not None, summaries

    # the shape was measured and learned: a cell of its scale class in the committed table,
    # its first choice not NCCL's pick, the same table on both pods
    tables = [latest(r) for r in runners]
    assert tables[0] == tables[1]
    assert tables[0] is not None
    assert scale in tables[0].scales
    leader = next(s for s in summaries if s["leader"])
    assert leader["online_shapes"] == [[NRANKS, NNODES, scale]]
    lead = next(r for r, s in zip(runners, summaries, strict=True) if s["leader"])
    online = {"state": "online"}
    assert lead.metrics.registry.get_sample_value("dynamiccl_sidecar_online_shapes", online) == 1

    # every rank took the same decision at every call of each communicator, exploration
    # included; the two communicators share the cell but draw their exploration each from
    # its own commId
    for cid in COMM_IDS:
        runs = [[(p.algo, p.proto, p.nchannels) for p in rank.played[cid]] for rank in ranks]
        assert runs[0] == runs[1]
    a, b = (ranks[0].played[cid] for cid in COMM_IDS)
    assert [(p.algo, p.proto) for p in a] != [(p.algo, p.proto) for p in b]

    # at the end the plugin forces the learned choice, not NCCL's pick, and it is faster
    for cid, nbytes in itertools.product(COMM_IDS, SIZES):
        nccl = surface.pick(4, nbytes)
        calls = [p for p in ranks[0].played[cid][-4 * L :] if p.nbytes == nbytes]
        ran = [(p.algo, p.proto) for p in calls]
        cell = tables[0].cell(Collective.ALLREDUCE, nbytes.bit_length() - 1, scale)
        assert cell is not None
        first = (cell.choices[0].algo.nccl_id, cell.choices[0].proto.nccl_id)
        assert ran.count(first) > len(ran) // 2, (nbytes, first, ran[:20])
        assert ran.count(nccl) < len(ran) // 4
        mean = sum(p.time_us for p in calls) / len(calls)
        assert mean < surface.mean_us(4, nbytes, *nccl)

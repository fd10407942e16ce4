"""The learning effect through the real pieces (issues 17.4 and 21): jobs find, the model adopts.

A harness-played cluster (dynamiccl/demo/sequence.py): jobs of one hardware
class in a row; the real plugin .so driven by the harness, the sidecar's
attribution / aggregation / exploration budget, HTTPS into the real ingest and
SQLite store, the real learning loop (TuningRun status, features into the
store, status.learning, registration, canary judge) and the retraining Job's
own command line run as a process, the operator's ConfigMap builder compiling
each job's table from its model version's export.

Stand-ins (said in learning_run.py and harness_job.py): an in-memory Kubernetes
API; the retraining Job as a local process with a 4-job held-out evaluation;
one rank plays each communicator; the epoch protocol collapsed to its outcome;
no in-job online tuner; times from the simulator with a departure instead of
GPUs; jobs of 12 000 calls of the two departed all-reduce sizes (the benchmark
runs the whole training step, 10^5 calls a job: benchmarks/learning_sequence_bench.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.api.nccl import Collective
from dynamiccl.demo.sequence import LearningSequence, SequenceConfig

pytestmark = pytest.mark.slow
CALLS = 12_000
STEP = ((Collective.ALLREDUCE, 32 << 20), (Collective.ALLREDUCE, 128 << 20))


def test_a_departure_is_found_by_exploration_and_adopted_by_the_retrained_model(
    tmp_path: Path,
) -> None:
    seq = LearningSequence(
        tmp_path, SequenceConfig(calls=CALLS, canary_percent=100, seed=1, step=STEP)
    )
    try:
        promoted = None
        for _ in range(9):
            row = seq.run_job()
            # the hard budget: at most 1 % of the job's collective time (jobs >= 10 000 calls)
            assert row.played.budget["exploration_cost_percent"] <= 1.0, row
            promoted = next((e for e in row.events if e.startswith("promoted")), None)
            if promoted:
                break
        rows = seq.rows
        found = [r.index for r in rows if any(f["algo"] == "tree" for f in r.found)]
        assert found, [r.found for r in rows]  # exploration measured Tree faster than Ring
        adopters = [r for r in rows if r.runs_departure]
        assert adopters, "no retrained model's table runs Tree in the departed cells"
        assert all(r.model_version != "default" for r in adopters)
        # the parent (the shipped model) never leaves NCCL's pick there and gains nothing
        parent = [r.speedup for r in rows if r.model_version == "default" and r.speedup]
        assert all(abs(s - 1.0) < 0.01 for s in parent)
        assert min(r.speedup or 0 for r in adopters) > 1.05
        assert promoted is not None, [r.events for r in rows]  # the sequential judge agrees
    finally:
        seq.close()


def test_where_nccl_is_right_the_model_keeps_nccls_pick(tmp_path: Path) -> None:
    cfg = SequenceConfig(calls=CALLS, canary_percent=100, seed=2, departure=None, step=STEP)
    seq = LearningSequence(tmp_path, cfg)
    try:
        for _ in range(4):
            row = seq.run_job()
            assert row.played.budget["exploration_cost_percent"] <= 1.0, row
            assert not row.runs_departure, row
            assert row.speedup is None or row.speedup > 0.99, row
        assert any(r.model_version != "default" for r in seq.rows)  # retrained models ran
        assert all(not r.found for r in seq.rows)  # nothing faster than NCCL's pick was found
    finally:
        seq.close()

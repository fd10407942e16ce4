"""One harness-played job through the real plugin .so: what its sidecar counts as exploration.

The plugin (a copy of the built `libnccl-tuner-dynamiccl.so`) decides every call
from the table the epoch protocol committed; the real sidecar (`sidecar.runner.Runner`,
file coordination) reads its profiler ring and sends the batches. Stand-ins: one rank
plays the communicator, the sidecar's threads are stepped on the job's clock, times
come from the simulator (dynamiccl/demo/harness_job.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Candidate, Cell, DecisionTable, scale_class, size_bucket
from dynamiccl.api.topology import TopologySpec
from dynamiccl.demo import sequence
from dynamiccl.demo.harness_job import JobSpec, play_job
from dynamiccl.sidecar.config import ExplorationInfo, JobInfo
from dynamiccl.sidecar.sender import Answer
from dynamiccl.testing.nccl_player import default_so
from dynamiccl.testing.surface import Surface
from dynamiccl.testing.workload import Op, build_time_table

if not default_so().exists():  # pragma: no cover - `make plugin` builds it
    pytest.skip("the plugin .so is not built (make plugin)", allow_module_level=True)

COLL, NBYTES = Collective.ALLGATHER, 16 << 20
CALLS = 12_000


def _job(calls: int) -> JobSpec:
    feats = sequence.features()
    return JobSpec(
        namespace="ml", name="j", uid="u", pod_name="p", pod_uid="pu", model_version="default",
        features=feats, step=[(COLL.nccl_id, NBYTES)], calls=calls,
    )  # fmt: skip


def _play(tmp: Path, table: DecisionTable, calls: int) -> tuple[dict[str, int], dict[str, object]]:
    """Play the job; calls per origin as the reward records carry them, and the budget."""
    times = build_time_table(TopologySpec.model_validate(sequence.NODE), (Op(COLL, NBYTES, 1, ""),))
    surface = Surface(times, None, seed=3)
    sent: list[dict[str, object]] = []

    class Ingest:
        def post(self, body: bytes) -> Answer:
            sent.append(json.loads(body))
            return Answer(200)

    job = _job(calls)
    info = JobInfo(namespace=job.namespace, name=job.name, kind="PyTorchJob", uid=job.uid)
    config = {
        "job.json": info.model_dump_json(),
        "features.json": job.features.model_dump_json(),
        "table.json": table.model_dump_json(),
        "exploration.json": ExplorationInfo.model_validate({"mode": "learned"}).model_dump_json(),
    }
    played = play_job(job, config, surface, tmp, Ingest())
    assert played.epochs >= 1  # the table reached the plugin through the epoch protocol
    by_origin: dict[str, int] = {}
    for batch in sent:
        for r in batch["records"]:  # type: ignore[attr-defined]
            by_origin[r["origin"]] = by_origin.get(r["origin"], 0) + int(r["count"])
    return by_origin, played.budget


def _nccl_own() -> tuple[Algo, Proto, int]:
    """NCCL's own (algorithm, protocol, channels) for the call, as the simulator has it."""
    times = build_time_table(TopologySpec.model_validate(sequence.NODE), (Op(COLL, NBYTES, 1, ""),))
    a, p, _ = times.nccl_default[f"{COLL.nccl_id}:{NBYTES}"]
    algo = next(x for x in Algo if x.nccl_id == a)
    proto = next(x for x in Proto if x.nccl_id == p)
    return algo, proto, times.nccl_channels[f"{COLL.nccl_id}:{NBYTES}:{a}:{p}"]


def test_a_candidate_naming_nccls_own_pick_does_not_count_nccls_calls_as_exploratory(
    tmp_path: Path,
) -> None:
    """The canary miscount (issue 21): in a cell without choices (NCCL decides), an exploration
    candidate pinning exactly NCCL's own channel count made every NCCL call look exploratory."""
    algo, proto, nch = _nccl_own()
    feats = sequence.features()
    sc = scale_class(feats.world_size, feats.topology.nodes)
    other = Proto.SIMPLE if proto is not Proto.SIMPLE else Proto.LL128
    cell = Cell(
        collective=COLL, bucket=size_bucket(NBYTES), scale=sc, choices=(),
        candidates=(
            Candidate(algo=algo, proto=proto, nchannels=nch, weight=1),  # NCCL's own, pinned
            Candidate(algo=algo, proto=other, weight=1),
        ),
        explore=1 / 128,
    )  # fmt: skip
    table = DecisionTable(version=1, scales=(sc,), cells=(cell,))
    by_origin, budget = _play(tmp_path, table, CALLS)
    assert sum(by_origin.values()) == CALLS
    explored = by_origin.get("explore", 0)
    # the plugin explores 1/128 of the calls at most while the budget is open
    assert 0 < explored <= CALLS / 128 + 16 + 10, by_origin  # + the calls before the share decides
    assert by_origin.get("default", 0) > 0.95 * CALLS, by_origin
    assert budget["exploration_cost_percent"] <= 1.0  # type: ignore[operator]

"""The real-node demo's pure parts: its policy, its jobs on the real node, what a row reports."""

from __future__ import annotations

import json

import pytest

from dynamiccl import constants as c
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, size_bucket
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.real_manifests import (
    DEPARTURE,
    NODE_LABEL,
    PODS,
    RANKS_PER_POD,
    Harness,
    harness_data,
    pytorchjob,
)
from dynamiccl.demo.real_report import format_row, summary, summary_lines
from dynamiccl.demo.real_sequence import (
    BIG,
    RealJob,
    avoids_departure,
    off_nvls_share,
    policy,
)

pytestmark = pytest.mark.unit
SCALE = 2
BUCKET = size_bucket(int(DEPARTURE["min_bytes"]))


def _table(*algos: Algo) -> DecisionTable:
    choices = tuple(Choice(algo=a, proto=Proto.SIMPLE) for a in algos)
    cell = Cell(collective=Collective.ALLREDUCE, bucket=BUCKET, scale=SCALE, choices=choices)
    return DecisionTable(version=1, scales=(SCALE,), cells=(cell,))


def test_the_policy_is_a_valid_learned_policy_for_the_demos_namespace_only() -> None:
    doc = policy("demo-ns-label", 5.0)
    spec = NCCLTuningPolicySpec.model_validate(doc["spec"])
    assert spec.mode.value == "learned"
    selector = doc["spec"]["selector"]["namespaceSelector"]
    assert selector == {"matchLabels": {"demo-ns-label": "jobs"}}
    assert spec.retraining.canary_percent == 100
    assert spec.retraining.min_new_experience == 0  # the demo opens it after the finding job


def test_a_table_leaves_nvls_only_if_its_first_choice_for_the_departed_cell_does() -> None:
    assert not avoids_departure(_table(Algo.NVLS, Algo.RING), SCALE)
    assert avoids_departure(_table(Algo.RING, Algo.NVLS), SCALE)
    assert not avoids_departure(_table(), SCALE)  # no choices: NCCL's pick (NVLS) runs
    assert not avoids_departure(_table(Algo.RING), SCALE + 1)  # another scale class's cell


def test_the_share_of_big_all_reduces_off_nvls_counts_every_other_algorithm() -> None:
    nvls, ring, tree = (a.nccl_id for a in (Algo.NVLS, Algo.RING, Algo.TREE))
    arms = {f"{nvls}:2:0": 20, f"{ring}:2:0": 60, f"{tree}:2:16": 20}
    assert off_nvls_share([{"decisions": {BIG: arms}}] * 2) == pytest.approx(0.8)
    assert off_nvls_share([{"decisions": {}}]) is None
    assert off_nvls_share([]) is None  # no rank's summary could be read


def test_the_jobs_pods_run_on_the_real_node_and_play_the_harness_there() -> None:
    job = pytorchjob("train-01", "img:1", {"runAsNonRoot": True}, {"privileged": False})
    assert job["metadata"]["annotations"][c.ANNOTATION_TUNE] == "true"
    (replicas,) = job["spec"]["pytorchReplicaSpecs"].values()
    pod = replicas["template"]["spec"]
    assert replicas["replicas"] == PODS
    assert pod["nodeSelector"] == {NODE_LABEL: "true"}
    assert pod["tolerations"] == [{"key": NODE_LABEL, "operator": "Exists"}]
    sources = pod["volumes"][0]["projected"]["sources"]
    assert [s["configMap"]["name"] for s in sources] == ["train-01-harness", "train-01-times"]
    data = harness_data(Harness(steps=10, seed=4))
    args = json.loads(data["args.json"])
    assert args["nranks"] == PODS * RANKS_PER_POD
    assert args["steps"] == 10
    assert args["departure"] == DEPARTURE
    assert "def play_rank" in data["harness_pod.py"]


def test_a_row_names_the_canary_and_what_the_loop_did() -> None:
    row = RealJob(2, "train-02", "v1", True, True, 1.153, 0, 0.0, 0.76, 57.0,
                  events=["promoted v1"])  # fmt: skip
    line = format_row(row)
    assert "v1 (canary)" in line
    assert "  0        yes" in line  # no cell from measurements; its table leaves NVLS
    assert "1.153" in line
    assert "76%" in line
    assert line.endswith("promoted v1")


def _job(index: int, model: str, measured: int, events: list[str]) -> RealJob:
    return RealJob(
        index, f"train-{index:02d}", model, model != "default", measured > 0, 1.0 + 0.1 * measured,
        10, 0.1, None, measured=["allreduce/b25/8x1: ring/simple 1.21x"] * measured,
        events=events,
    )  # fmt: skip


def test_the_summary_says_when_the_finding_held_and_from_which_job_every_job_ran_it() -> None:
    rows = [
        _job(1, "default", 0, []),
        _job(2, "default", 0, ["finding holds: allreduce 32 MiB ring/simple x1.21 (2 jobs)"]),
        _job(3, "default", 1, ["retrained v1 in 11 s", "canary v1"]),
        _job(4, "v1", 1, []),
        _job(5, "v1", 1, ["promoted v1"]),
    ]
    s = summary(rows, {"version": "v1"}, {}, 12.0)
    assert (s["finding_holds_after"], s["every_job_from"], s["parent_with_finding"]) == (2, 3, 3)
    assert s["promoted_after"] == 5
    assert s["with_finding_speedups"] == [1.1, 1.1, 1.1]
    lines = summary_lines(s, 5.0)
    assert "every job starts with it from: job 3 (a parent-model job with it: job 3)" in lines
    # a later job without it: "every job from" moves past it
    rows.append(_job(6, "v1", 0, []))
    assert summary(rows, {}, {}, 1.0)["every_job_from"] is None

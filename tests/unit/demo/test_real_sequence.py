"""The real-node demo's pure parts: its policy, its jobs on the real node, what they ran."""

from __future__ import annotations

import json

import pytest

from dynamiccl import constants as c
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, size_bucket
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.real_sequence import BIG, avoids_departure, off_nvls_share, policy
from dynamiccl.testing.real_manifests import (
    DEPARTURE,
    NODE_LABEL,
    PODS,
    RANKS_PER_POD,
    Harness,
    harness_data,
    pytorchjob,
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

"""The operator's decision and the admission webhook, as the demo drives them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.table import DecisionTable, scale_class
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import Mode, NCCLTuningPolicySpec
from dynamiccl.operator.controller import configmap
from dynamiccl.operator.controller.policy_match import choose_model, parse_policies
from dynamiccl.operator.webhook import mutate
from dynamiccl.testing.local_job import (
    LEARNED_POLICY,
    Cluster,
    LocalJobError,
    admit,
    create,
    load_policies,
)

POLICIES = Path(__file__).resolve().parents[3] / "examples" / "policies"


def _policies(**learned: Any) -> list[Any]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted(POLICIES.glob("*.yaml"))]
    for d in docs:
        if d["metadata"]["name"] == "ml-learned":
            d["spec"]["model"] = {"version": "default"}
            d["spec"].update(learned)
    return parse_policies(docs)[0]


class Compiler:
    def __init__(self) -> None:
        self.calls: list[tuple[bool, str]] = []

    def __call__(self, f: StateFeatures, spec: NCCLTuningPolicySpec, version: str) -> DecisionTable:
        self.calls.append((f.scheduled, version))
        return DecisionTable(version=1, scales=(scale_class(f.world_size, f.topology.nodes),))


def test_the_job_is_decided_admitted_bound_and_decided_again(
    spec: TopologySpec, job: dict[str, Any]
) -> None:
    comp = Compiler()
    inc = create(
        job,
        Cluster.of(spec, "ml-team", {"team": "ml"}),
        _policies(),
        rng=random.Random(0),
        image="img:1",
        ingest_url="https://127.0.0.1:1/v1/rewards",
        ingest_ca="CA PEM",
        compiler=comp,
    )
    assert comp.calls == [(False, "default"), (True, "default")]  # estimated, then observed
    assert inc.policy_name == "ml-learned"
    assert inc.model_version == "default"
    assert not inc.canary
    assert not inc.estimated.scheduled
    assert inc.features.scheduled
    assert inc.features.world_size == 16
    assert inc.table()["scales"] == [scale_class(16, 2)]
    data = inc.config_map["data"]
    assert data[configmap.KEY_INGEST_CA] == "CA PEM"
    assert json.loads(data[configmap.KEY_JOB])["uid"] == inc.uid
    assert inc.tuning_run["kind"] == "TuningRun"
    for pod in inc.pods:
        assert mutate.is_injected(pod)
        assert pod["spec"]["nodeName"].startswith("aws-p5-2node-")
        sidecar = next(x for x in pod["spec"]["initContainers"] if x["name"] == mutate.SIDECAR)
        env = {e["name"]: e.get("value") for e in sidecar["env"]}
        assert env[c.ENV_INGEST_URL] == "https://127.0.0.1:1/v1/rewards"
        assert pod["metadata"]["annotations"][c.ANNOTATION_INJECTED].startswith("sha256:")


def test_the_webhook_leaves_a_pod_alone_without_the_jobs_configmap() -> None:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "labels": {c.LABEL_KUBEFLOW_JOB_NAME: "other-job"},
        },
        "spec": {"containers": [{"name": "x", "image": "y"}]},
    }
    cm = {"metadata": {"name": configmap.object_name("job"), "namespace": "ns"}, "data": {}}
    assert admit(pod, cm, "img", "") == pod
    pod["metadata"]["labels"][c.LABEL_KUBEFLOW_JOB_NAME] = "job"
    assert mutate.is_injected(admit(pod, cm, "img", ""))


def test_untuned_jobs_say_why(spec: TopologySpec, job: dict[str, Any]) -> None:
    cluster = Cluster.of(spec, "ml-team", {"team": "ml"})
    kw: dict[str, Any] = {"rng": random.Random(0), "image": "i", "ingest_url": "", "ingest_ca": ""}
    del job["metadata"]["annotations"][c.ANNOTATION_TUNE]
    with pytest.raises(LocalJobError, match="not opted in"):
        create(job, cluster, _policies(), compiler=Compiler(), **kw)
    job["metadata"]["annotations"][c.ANNOTATION_TUNE] = "true"
    job["metadata"]["annotations"][c.ANNOTATION_MODEL_SIZE] = "huge"
    with pytest.raises(LocalJobError, match="InvalidAnnotations"):
        create(job, cluster, _policies(), compiler=Compiler(), **kw)
    del job["metadata"]["annotations"][c.ANNOTATION_MODEL_SIZE]
    off = _policies(mode="off", exploration={"budgetCalls": 0})
    with pytest.raises(LocalJobError, match="PolicyModeOff"):
        create(job, cluster, off, compiler=Compiler(), **kw)


def test_the_learned_sample_starts_from_default_and_retrains_after_one_job() -> None:
    docs = load_policies()
    policies, errors = parse_policies(docs)
    assert not errors
    assert {p.name for p in policies} == {"observe-everything", "ml-learned", "p5-efa-static"}
    learned = next(p for p in policies if p.name == LEARNED_POLICY)
    assert learned.spec.mode is Mode.LEARNED
    assert choose_model(learned.spec.model, "any-uid") == ("default", False)
    # the learning loop's trigger and canary share, read from the object as the loop reads it
    doc = next(d for d in docs if d["metadata"]["name"] == LEARNED_POLICY)
    assert doc["spec"]["retraining"] == {"minNewExperience": 1, "canaryPercent": 100}
    assert all(d["metadata"].get("uid") and d["metadata"].get("creationTimestamp") for d in docs)

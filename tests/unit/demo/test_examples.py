"""Everything in examples/ is what the operator and the CRDs accept, and does what it says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dynamiccl import constants as c
from dynamiccl.api.crds import NCCL_TUNING_POLICY
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import JobKind, Mode, NCCLTuningPolicySpec
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import jobkinds, policy_match
from dynamiccl.operator.crdgen import crd
from dynamiccl.operator.webhook import inject, mutate

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
JOBS = ("pytorchjob.yaml", "trainjob.yaml", "mpijob.yaml")
POLICIES = sorted((EXAMPLES / "policies").glob("*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), path
    return doc


def _policy_schema() -> dict[str, Any]:
    version = crd(NCCL_TUNING_POLICY)["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_there_is_one_sample_policy_per_mode_the_issue_names() -> None:
    modes = {NCCLTuningPolicySpec.model_validate(_load(p)["spec"]).mode for p in POLICIES}
    assert modes == {Mode.OBSERVE, Mode.LEARNED, Mode.STATIC}


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_sample_policy_is_valid_for_the_crd_and_the_model(path: Path) -> None:
    doc = _load(path)
    assert doc["apiVersion"] == NCCL_TUNING_POLICY.api_version
    assert doc["kind"] == NCCL_TUNING_POLICY.kind
    jsonschema.Draft4Validator(_policy_schema()).validate(doc)  # the schema kubectl applies
    spec = NCCLTuningPolicySpec.model_validate(doc["spec"])  # + the CEL rules, mirrored
    parsed, errors = policy_match.parse_policies([doc])
    assert errors == []
    assert parsed[0].spec == spec


def test_the_learned_sample_canaries_a_tenth_of_new_jobs() -> None:
    spec = NCCLTuningPolicySpec.model_validate(
        _load(EXAMPLES / "policies" / "learned-canary.yaml")["spec"]
    )
    assert spec.mode is Mode.LEARNED
    assert spec.model.canary_percent == 10
    assert spec.model.canary_version is not None
    uids = [f"uid-{i}" for i in range(2000)]
    share = sum(policy_match.choose_model(spec.model, u)[1] for u in uids) / len(uids)
    assert 0.07 < share < 0.13


def test_the_static_sample_sets_its_knobs_at_launch_and_never_explores() -> None:
    from dynamiccl.operator.controller import configmap  # noqa: PLC0415

    spec = NCCLTuningPolicySpec.model_validate(
        _load(EXAMPLES / "policies" / "static-known-cluster.yaml")["spec"]
    )
    assert spec.mode is Mode.STATIC
    assert configmap.env_knobs(spec) == {"NCCL_NTHREADS": "512", "NCCL_BUFFSIZE": "8388608"}


def test_a_broken_policy_is_rejected_by_schema_and_model_alike() -> None:
    doc = _load(EXAMPLES / "policies" / "learned-canary.yaml")
    doc["spec"]["constraints"]["channels"] = {"min": 0, "max": 32}  # min must be >= 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(_policy_schema()).validate(doc)
    _, errors = policy_match.parse_policies([doc])
    assert len(errors) == 1
    assert "channels" in errors[0]


@pytest.mark.parametrize("name", JOBS)
def test_sample_job_is_opted_in_with_valid_annotations(name: str) -> None:
    doc = _load(EXAMPLES / name)
    ann = doc["metadata"]["annotations"]
    assert ann[c.ANNOTATION_TUNE] == "true"
    parsed = job_annotations.parse(ann)
    assert parsed.errors == ()
    assert job_annotations.opted_in(parsed, {})
    shape = jobkinds.job_shape(doc)
    assert shape.gpus_per_pod == 8
    assert shape.world_size == shape.replicas * shape.nproc_per_node


def test_sample_job_shapes() -> None:
    shapes = {n: jobkinds.job_shape(_load(EXAMPLES / n)) for n in JOBS}
    assert (shapes["pytorchjob.yaml"].replicas, shapes["pytorchjob.yaml"].world_size) == (2, 16)
    assert (shapes["trainjob.yaml"].replicas, shapes["trainjob.yaml"].world_size) == (4, 32)
    assert (shapes["mpijob.yaml"].replicas, shapes["mpijob.yaml"].world_size) == (2, 16)


@pytest.mark.parametrize(
    ("name", "injected_groups"),
    [("pytorchjob.yaml", 2), ("mpijob.yaml", 1), ("trainjob.yaml", 0)],
)
def test_inject_mutates_exactly_the_training_pods(name: str, injected_groups: int) -> None:
    doc = _load(EXAMPLES / name)
    out, notes = inject.inject(doc, inject.Settings(image="dynamiccl:test"))
    groups = jobkinds.replica_groups(out)
    injected = [g for g in groups if g.template is not None and mutate.is_injected(g.template)]
    assert len(injected) == injected_groups
    if name != "pytorchjob.yaml":
        assert notes  # the launcher / the runtime's pods are explained, not silently skipped
    for g in injected:
        assert g.template is not None
        env = {e["name"] for ct in g.template["spec"]["containers"] for e in ct["env"]}
        assert {c.ENV_NCCL_TUNER_PLUGIN, c.ENV_NCCL_PROFILER_PLUGIN, c.ENV_SHM_PATH} <= env


@pytest.mark.parametrize(
    ("policy", "ns_labels", "job_labels", "selected"),
    [
        ("learned-canary.yaml", {"team": "ml"}, {}, True),
        ("learned-canary.yaml", {"team": "web"}, {}, False),
        ("static-known-cluster.yaml", {}, {"cluster-profile": "p5-efa"}, True),
        ("static-known-cluster.yaml", {}, {}, False),
        ("observe-only.yaml", {}, {}, True),
    ],
)
def test_sample_policy_selectors(
    policy: str, ns_labels: dict[str, str], job_labels: dict[str, str], selected: bool
) -> None:
    parsed, _ = policy_match.parse_policies([_load(EXAMPLES / "policies" / policy)])
    got = policy_match.applies(parsed[0], JobKind.PYTORCHJOB, job_labels, ns_labels)
    assert got is selected


def test_all_three_policies_together_pick_the_most_specific() -> None:
    parsed, _ = policy_match.parse_policies([_load(p) for p in POLICIES])
    match = policy_match.select(
        parsed,
        kind=JobKind.PYTORCHJOB,
        job_labels={"cluster-profile": "p5-efa"},
        namespace_labels={"team": "ml"},
    )
    assert match.policy is not None
    assert match.policy.name == "p5-efa-static"  # priority 200 beats 100 beats 0
    assert match.applicable == ("p5-efa-static", "ml-learned", "observe-everything")


def test_example_topology_is_a_valid_spec_and_the_calibrated_system() -> None:
    spec = TopologySpec.model_validate(_load(EXAMPLES / "topology-aws-p5-2node.yaml"))
    calibrated = TopologySpec.model_validate(
        _load(ROOT / "policy" / "data" / "calibration" / "systems" / "aws-p5-2node.yaml")
    )
    assert spec == calibrated

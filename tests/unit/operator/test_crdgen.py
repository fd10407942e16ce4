"""CRD generation: structural, deterministic, in sync with the committed files, CEL == pydantic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from celpy.adapter import json_to_cel
from pydantic import BaseModel, ValidationError

from dynamiccl.api.crds import CUSTOM_RESOURCES, NCCL_TUNING_POLICY, TUNING_RUN
from dynamiccl.api.features import StateFeatures, Tier, TierMix, TopologyFeatures
from dynamiccl.api.k8s import ObjectRef, dump
from dynamiccl.api.knob_ranges import knob_range_text
from dynamiccl.api.topology import Fabric, Intra
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.api.tuning_run import TuningRunSpec
from dynamiccl.operator import crdgen
from tests.knob_samples import OUTSIDE_NCCL_RANGE

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = (ROOT / "crds", ROOT / "charts" / "dynamiccl" / "crds")


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crds_match_the_generator(folder: Path) -> None:
    want = crdgen.all_crds()
    have = {p.name: p.read_text() for p in folder.glob("*.yaml")}
    assert sorted(have) == sorted(want), "regenerate: python -m dynamiccl.operator.crdgen"
    for name, text in want.items():
        assert have[name] == text, (
            f"{folder / name} drifted from the models; regenerate with "
            "python -m dynamiccl.operator.crdgen --out crds --out charts/dynamiccl/crds"
        )


def test_generation_is_deterministic() -> None:
    assert crdgen.all_crds() == crdgen.all_crds()


def _walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node.get("properties", {}).values():
        out += _walk(child)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out += _walk(node[key])
    return out


@pytest.mark.parametrize("resource", CUSTOM_RESOURCES, ids=lambda r: r.kind)
def test_schema_is_structural(resource: Any) -> None:
    doc = crdgen.crd(resource)
    version = doc["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for node in _walk(schema):
        for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "title", "$defs", "uniqueItems"):
            assert forbidden not in node
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields")
        assert node.get("additionalProperties") is not False
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"][-1]["name"] == "Age"


def test_structural_check_rejects_unions() -> None:
    class Bad(BaseModel):
        x: int | str

    with pytest.raises(ValueError, match="union"):
        crdgen.model_schema(Bad)


def test_printer_columns_point_at_real_fields() -> None:
    for resource in CUSTOM_RESOURCES:
        schema = crdgen.crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for col in crdgen.crd(resource)["spec"]["versions"][0]["additionalPrinterColumns"]:
            if col["jsonPath"].startswith(".metadata"):
                continue
            node = schema
            for part in col["jsonPath"].strip(".").split("."):
                node = node["properties"][part]
            assert node["type"] in ("string", "integer", "number", "boolean"), col


# --- CEL rules: evaluated with a real CEL implementation, compared with pydantic ---------


def _rules_violated(schema: dict[str, Any], doc: Any) -> list[str]:
    """Evaluate every x-kubernetes-validations rule present in `doc` (CEL, as the apiserver)."""
    out: list[str] = []
    if isinstance(doc, dict):
        for rule in schema.get("x-kubernetes-validations", []):
            env = celpy.Environment()
            prog = env.program(env.compile(rule["rule"]))
            if not bool(prog.evaluate({"self": json_to_cel(doc)})):
                out.append(rule["message"])
        for key, value in doc.items():
            if key in schema.get("properties", {}):
                out += _rules_violated(schema["properties"][key], value)
    elif isinstance(doc, list) and "items" in schema:
        for item in doc:
            out += _rules_violated(schema["items"], item)
    return out


def _policy_schema() -> dict[str, Any]:
    doc = crdgen.crd(NCCL_TUNING_POLICY)
    spec: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out: dict[str, Any] = spec["properties"]["spec"]
    return out


GOOD = [
    {},
    {"mode": "static", "exploration": {"budgetCalls": 0}},
    {"constraints": {"channels": {"min": 2, "max": 2}, "allowedProtocols": ["ll", "simple"]}},
    {
        "constraints": {
            "envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256, 512], "default": 512}]
        }
    },
    {
        "constraints": {
            "envKnobs": [
                {"name": "NCCL_IB_QPS_PER_CONNECTION", "allowed": [1, 128], "default": 1},
                {"name": "NCCL_IB_SPLIT_DATA_ON_QPS", "allowed": [0, 1]},
                {"name": "NCCL_NCHANNELS_PER_NET_PEER", "allowed": [1, 64]},
                {"name": "NCCL_P2P_NET_CHUNKSIZE", "allowed": [1024, 16 << 20]},
                {"name": "NCCL_CROSS_NIC", "allowed": [0, 1, 2], "default": 2},
                # 16 x 4 = 64 in the arm that moves the threads: NCCL's limit, allowed
                {"name": "NCCL_SOCKET_NTHREADS", "allowed": [1, 16], "default": 1},
                {"name": "NCCL_NSOCKS_PERTHREAD", "allowed": [4, 64], "default": 4},
            ]
        }
    },
    {"model": {"version": "v3", "canaryVersion": "v4", "canaryPercent": 10}},
    {"selector": {"jobSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}}},
    {"retraining": {"schedule": "0 3 * * *"}},
]
BAD = [
    ({"constraints": {"channels": {"min": 9, "max": 4}}}, "min must be <= max"),
    ({"mode": "learned", "exploration": {"budgetCalls": 0}}, "budgetCalls > 0"),
    ({"model": {"version": "v3", "canaryPercent": 5}}, "canaryVersion is required"),
    ({"model": {"version": "v3", "canaryVersion": "v3"}}, "must differ"),
    (
        {"constraints": {"envKnobs": [{"name": "NCCL_BUFFSIZE", "allowed": [1], "default": 2}]}},
        "default must be one of allowed",
    ),
    (
        {
            "constraints": {
                "envKnobs": [
                    {"name": "NCCL_NTHREADS", "allowed": [64]},
                    {"name": "NCCL_NTHREADS", "allowed": [128]},
                ]
            }
        },
        "unique",
    ),
    (
        {"selector": {"jobSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}},
        "values must be non-empty",
    ),
    *(
        (
            {"constraints": {"envKnobs": [{"name": k.value, "allowed": [bad]}]}},
            f"{k.value} values must be {knob_range_text(k)} (NCCL's documented range)",
        )
        for k, bads in OUTSIDE_NCCL_RANGE.items()
        for bad in bads
    ),
    (  # the arm moving NSOCKS_PERTHREAD to 8 keeps the default 16 threads: 128 sockets
        {
            "constraints": {
                "envKnobs": [
                    {"name": "NCCL_SOCKET_NTHREADS", "allowed": [4, 16], "default": 16},
                    {"name": "NCCL_NSOCKS_PERTHREAD", "allowed": [1, 8], "default": 1},
                ]
            }
        },
        "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must not exceed 64",
    ),
    (  # the limit holds whichever knob is declared first; huge values do not overflow CEL
        {
            "constraints": {
                "envKnobs": [
                    {"name": "NCCL_NSOCKS_PERTHREAD", "allowed": [1 << 34], "default": 1 << 34},
                    {"name": "NCCL_SOCKET_NTHREADS", "allowed": [1 << 34], "default": 1 << 34},
                ]
            }
        },
        "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must not exceed 64",
    ),
]


@pytest.mark.parametrize("spec", GOOD)
def test_cel_and_pydantic_accept_the_same_good_specs(spec: dict[str, Any]) -> None:
    NCCLTuningPolicySpec.model_validate(spec)
    schema = _policy_schema()
    full = NCCLTuningPolicySpec.model_validate(spec).model_dump(mode="json", exclude_none=True)
    jsonschema.Draft4Validator(schema).validate(full)
    assert _rules_violated(schema, full) == []


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_cel_and_pydantic_reject_the_same_bad_specs(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError):
        NCCLTuningPolicySpec.model_validate(spec)
    violated = _rules_violated(_policy_schema(), _merge_defaults(spec))
    assert any(message in m for m in violated), violated


def _merge_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """Apply the schema defaults the apiserver would apply before running CEL rules."""
    out: dict[str, Any] = _apply_defaults(_policy_schema(), spec)
    return out


def _apply_defaults(schema: dict[str, Any], doc: Any) -> Any:
    if isinstance(doc, dict):
        out = dict(doc)
        for key, sub in schema.get("properties", {}).items():
            if key not in out and "default" in sub:
                out[key] = sub["default"]
            if key in out:
                out[key] = _apply_defaults(sub, out[key])
        return out
    if isinstance(doc, list) and "items" in schema:
        return [_apply_defaults(schema["items"], x) for x in doc]
    return doc


def test_schema_rejects_what_pydantic_rejects_by_type() -> None:
    schema = _policy_schema()
    for bad in (
        {"mode": "sometimes"},
        {"priority": 5000},
        {"constraints": {"allowedAlgorithms": ["warp"]}},
    ):
        with pytest.raises(ValidationError):
            NCCLTuningPolicySpec.model_validate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft4Validator(schema).validate(bad)


def test_tuning_run_schema_accepts_a_dumped_run() -> None:
    features = StateFeatures(
        world_size=16,
        gpus_per_pod=8,
        replicas=2,
        nproc_per_node=8,
        topology=TopologyFeatures(
            name="job",
            gpu="H100",
            gpus_per_node=8,
            nodes=2,
            intra=Intra.NVSWITCH,
            nvlink_GBps=450,
            nvls=True,
            pcie_gen=5,
            nics_per_node=8,
            nic_Gbps=400,
            fabric=Fabric.INFINIBAND,
            sharp=False,
            tier_max=Tier.SAME_RACK,
            tier_mix=TierMix(same_node=7 / 15, same_rack=8 / 15),
        ),
    )
    spec = TuningRunSpec(
        job_ref=ObjectRef(api_version="kubeflow.org/v1", kind="PyTorchJob", name="j"),
        features=features,
    )
    schema = crdgen.crd(TUNING_RUN)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator(schema["properties"]["spec"]).validate(dump(spec))


def test_crd_yaml_round_trips() -> None:
    for text in crdgen.all_crds().values():
        assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition"


def test_main_writes_files(tmp_path: Path) -> None:
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == set(crdgen.all_crds())


def test_node_topology_schema_accepts_the_agents_objects() -> None:
    from dynamiccl.api import node_topology as nt  # noqa: PLC0415
    from dynamiccl.api.crds import NODE_TOPOLOGY  # noqa: PLC0415

    obj = nt.custom_resource("gpu-0", nt.NodeTopology(node_name="gpu-0", nvls=True))
    schema = crdgen.crd(NODE_TOPOLOGY)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator(schema).validate(_prune_nulls(obj))
    assert crdgen.crd(NODE_TOPOLOGY)["spec"]["scope"] == "Cluster"


def _prune_nulls(doc: Any) -> Any:
    """What the apiserver does to nulls of non-nullable fields before validating."""
    if isinstance(doc, dict):
        return {k: _prune_nulls(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [_prune_nulls(x) for x in doc]
    return doc

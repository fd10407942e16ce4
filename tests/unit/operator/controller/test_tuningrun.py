"""TuningRun objects and the conditions that explain each decision."""

from __future__ import annotations

import jsonschema

from dynamiccl.api.crds import TUNING_RUN
from dynamiccl.api.tuning_policy import Mode
from dynamiccl.api.tuning_run import TuningRunSpec, TuningRunStatus
from dynamiccl.operator import crdgen
from dynamiccl.operator.controller import tuningrun
from dynamiccl.operator.controller.configmap import JobRef

JOB = JobRef("kubeflow.org/v1", "PyTorchJob", "llm", "team-a", "uid-1")


def _schema(part: str) -> dict[str, object]:
    doc = crdgen.crd(TUNING_RUN)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return doc["properties"][part]  # type: ignore[no-any-return]


def test_untuned_decision_records_why() -> None:
    d = tuningrun.Decision(
        job=JOB,
        tuned=False,
        reason="InvalidAnnotations",
        message="bad",
        annotation_errors=["dynamiccl.io/tune='yes': expected true or false"],
    )
    obj = tuningrun.build(d)
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert obj["spec"]["mode"] == "off"
    assert obj["spec"]["configMapName"] == ""
    jsonschema.Draft4Validator(_schema("spec")).validate(obj["spec"])
    TuningRunSpec.model_validate(obj["spec"])
    st = tuningrun.status(d, at="2025-01-01T00:00:00Z")
    jsonschema.Draft4Validator(_schema("status")).validate(st)
    conds = {x["type"]: x for x in st["conditions"]}
    assert conds["AnnotationsValid"]["status"] == "False"
    assert "expected true or false" in conds["AnnotationsValid"]["message"]
    assert conds["Tuned"]["reason"] == "InvalidAnnotations"
    assert st["phase"] == "Untuned"


def test_status_keeps_sidecar_fields_and_transition_times() -> None:
    d = tuningrun.Decision(
        job=JOB,
        tuned=True,
        reason="Tuned",
        message="ok",
        mode=Mode.LEARNED,
        policy_name="gold",
        policy_message="gold won",
    )
    first = tuningrun.status(d, at="t0")
    first["reward"] = {
        "calls": 5,
        "measuredSeconds": 1.0,
        "ncclDefaultSeconds": 1.2,
        "speedup": 1.2,
        "buckets": [],
    }
    first["phase"] = "Tuning"
    again = tuningrun.status(d, current=first, at="t1")
    assert again["reward"]["speedup"] == 1.2
    assert again["phase"] == "Tuning"
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {"t0"}
    TuningRunStatus.model_validate(again)

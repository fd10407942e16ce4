"""Decisions for jobs: tuned, invalid annotations, no policy, mode off, not opted in."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from dynamiccl import constants as c
from dynamiccl.api.table import scale_class
from dynamiccl.operator.controller import reconcile
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.policy.online import knob_experiment

Job = Callable[..., dict[str, Any]]


def _inputs(job: dict[str, Any], kwok: dict[str, Any], **spec: Any) -> reconcile.Inputs:
    return _inputs_for(job, kwok, {"metadata": {"name": "gold"}, "spec": spec})


def _inputs_for(
    job: dict[str, Any], kwok: dict[str, Any], policy: dict[str, Any]
) -> reconcile.Inputs:
    pols, errs = parse_policies([policy])
    return reconcile.Inputs(
        job=job,
        namespace_labels={},
        policies=pols,
        policy_errors=errs,
        cluster_nodes=list(kwok.values()),
    )


def test_tuned_job_gets_config_map_and_run(pytorchjob: Job, kwok_nodes: dict[str, Any]) -> None:
    out = reconcile.decide(_inputs(pytorchjob(), kwok_nodes))
    assert out is not None
    assert out.decision.tuned
    assert out.config_map is not None
    assert out.config_map["metadata"]["name"] == "llm-dynamiccl"
    assert out.tuning_run["spec"]["policyName"] == "gold"
    assert out.tuning_run["spec"]["features"]["world_size"] == 16
    ev = reconcile.event(out, "t")
    assert (ev["type"], ev["reason"]) == ("Normal", "NCCLTuned")
    assert "gold" in ev["message"]


def test_malformed_annotations_run_untuned_with_a_warning(
    pytorchjob: Job, kwok_nodes: dict[str, Any]
) -> None:
    job = pytorchjob(annotations={c.ANNOTATION_PARALLELISM: "4d"})
    out = reconcile.decide(_inputs(job, kwok_nodes))
    assert out is not None
    assert not out.decision.tuned
    assert out.config_map is None
    assert out.decision.reason == "InvalidAnnotations"
    ev = reconcile.event(out, "t")
    assert ev["type"] == "Warning"
    assert c.ANNOTATION_PARALLELISM in ev["message"]


def test_malformed_tune_value_is_reported_too(pytorchjob: Job, kwok_nodes: dict[str, Any]) -> None:
    job = pytorchjob(annotations={c.ANNOTATION_TUNE: "yes"})
    out = reconcile.decide(_inputs(job, kwok_nodes))
    assert out is not None
    assert out.decision.reason == "InvalidAnnotations"


def test_unannotated_job_is_ignored(pytorchjob: Job, kwok_nodes: dict[str, Any]) -> None:
    job = pytorchjob()
    del job["metadata"]["annotations"][c.ANNOTATION_TUNE]
    assert reconcile.decide(_inputs(job, kwok_nodes)) is None


def test_no_policy_and_mode_off(pytorchjob: Job, kwok_nodes: dict[str, Any]) -> None:
    out = reconcile.decide(_inputs(pytorchjob(), kwok_nodes, selector={"jobKinds": ["MPIJob"]}))
    assert out is not None
    assert (out.decision.tuned, out.decision.reason) == (False, "NoPolicy")
    out = reconcile.decide(_inputs(pytorchjob(), kwok_nodes, mode="off"))
    assert out is not None
    assert (out.decision.tuned, out.decision.reason) == (False, "PolicyModeOff")


def test_events_only_on_change(pytorchjob: Job, kwok_nodes: dict[str, Any]) -> None:
    out = reconcile.decide(_inputs(pytorchjob(), kwok_nodes))
    assert out is not None
    assert reconcile.event_needed(out, None)
    same = {"conditions": [{"type": "Tuned", "reason": "Tuned", "message": out.decision.message}]}
    assert not reconcile.event_needed(out, same)


KNOB_SPEC: dict[str, Any] = {
    "mode": "learned",
    "constraints": {"envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256, 512], "default": 512}]},
    "exploration": {"envKnobJobPercent": 0},
}


def _with_status(
    job: dict[str, Any], kwok: dict[str, Any], status: dict[str, Any]
) -> reconcile.Inputs:
    return _inputs_for(
        job, kwok, {"metadata": {"name": "gold"}, "spec": KNOB_SPEC, "status": status}
    )


def _env(out: reconcile.Outcome | None) -> dict[str, str]:
    assert out is not None
    assert out.config_map is not None
    env = json.loads(out.config_map["data"]["env.json"])
    spec_env = {e["name"]: e["value"] for e in out.tuning_run["spec"]["envKnobs"]}
    assert env == spec_env  # the ConfigMap the webhook reads and the TuningRun agree
    return dict(env)


def test_a_job_gets_the_knobs_its_cohort_adopted_and_keeps_them(
    pytorchjob: Job, kwok_nodes: dict[str, Any]
) -> None:
    job = pytorchjob()
    first = reconcile.decide(_with_status(job, kwok_nodes, {}))
    assert _env(first) == {"NCCL_NTHREADS": "512"}  # nothing measured yet: declared default
    assert first is not None
    assert first.decision.features is not None
    cohort, _ = knob_experiment.cohort_of(first.decision.features)
    fast = [{"name": "NCCL_NTHREADS", "value": 256}]
    status = {
        "envKnobs": {
            "cohorts": [
                {
                    "cohort": cohort,
                    "arms": [
                        {
                            "knobs": [{"name": "NCCL_NTHREADS", "value": 512}],
                            "jobs": 6,
                            "state": "baseline",
                        },
                        {
                            "knobs": fast,
                            "jobs": 6,
                            "speedup": 1.1,
                            "low": 1.05,
                            "high": 1.15,
                            "state": "better",
                        },
                    ],
                    "adopted": fast,
                }
            ]
        }
    }
    adopted = reconcile.decide(_with_status(job, kwok_nodes, status))
    assert _env(adopted) == {"NCCL_NTHREADS": "256"}
    assert adopted is not None
    assert "adopted in cohort" in adopted.decision.message
    # a job that already has its knobs keeps them, whatever the experiment says now
    inp = _with_status(job, kwok_nodes, status)
    kept = reconcile.decide(dataclasses.replace(inp, previous_env={"NCCL_NTHREADS": "512"}))
    assert _env(kept) == {"NCCL_NTHREADS": "512"}
    # an experiment no loop has rewritten for days: what it adopted still stands
    updated = {"envKnobs": status["envKnobs"] | {"updated": "2026-01-01T00:00:00Z"}}
    stale = dataclasses.replace(_with_status(job, kwok_nodes, updated), now_unix_s=1_800_000_000.0)
    assert _env(reconcile.decide(stale)) == {"NCCL_NTHREADS": "256"}
    # a malformed status counts as none
    broken = reconcile.decide(_with_status(job, kwok_nodes, {"envKnobs": {"cohorts": "nope"}}))
    assert _env(broken) == {"NCCL_NTHREADS": "512"}


def test_a_finding_of_the_jobs_class_is_its_table_and_its_tuning_run_says_so(
    pytorchjob: Job, kwok_nodes: dict[str, Any]
) -> None:
    """Issue 29: measured beats modelled, through the operator's own decision."""
    job = pytorchjob()
    first = reconcile.decide(_inputs(job, kwok_nodes))
    assert first is not None
    assert first.decision.features is not None
    feats = first.decision.features
    assert first.tuning_run["spec"]["measuredCells"] == []
    cls, _ = knob_experiment.cohort_of(feats)
    finding = {
        "collective": "allreduce", "sizeBucket": 26, "nranks": feats.world_size,
        "nnodes": feats.topology.nodes, "algo": "tree", "proto": "simple", "speedup": 1.2,
        "ncclAlgo": "ring", "ncclProto": "simple", "supporting": 2, "namespaces": 1,
        "holds": True,
    }  # fmt: skip
    status = {"learning": {"hardwareClasses": [{"hardwareClass": cls, "findings": [finding]}]}}
    policy = {"metadata": {"name": "gold"}, "spec": {}, "status": status}
    out = reconcile.decide(_inputs_for(job, kwok_nodes, policy))
    assert out is not None
    assert out.config_map is not None
    (line,) = out.tuning_run["spec"]["measuredCells"]
    assert "allreduce/b26" in line
    assert "tree/simple" in line
    assert "1 cell(s) from measurements" in out.decision.message
    table = json.loads(out.config_map["data"]["table.json"])
    world = scale_class(feats.world_size, feats.topology.nodes)
    (cell,) = [
        c
        for c in table["cells"]
        if (c["collective"], c["bucket"], c["scale"]) == ("allreduce", 26, world)
    ]
    assert cell["choices"][0]["algo"] == "tree"
    # not holding (one job's word): the table's choice is the model's
    finding["holds"] = False
    kept = reconcile.decide(_inputs_for(job, kwok_nodes, policy))
    assert kept is not None
    assert kept.tuning_run["spec"]["measuredCells"] == []


def _finding_for(feats: Any) -> dict[str, Any]:
    return {
        "collective": "allreduce", "sizeBucket": 26, "nranks": feats.world_size,
        "nnodes": feats.topology.nodes, "algo": "tree", "proto": "simple", "speedup": 1.2,
        "ncclAlgo": "ring", "ncclProto": "simple", "supporting": 2, "namespaces": 2,
        "holds": True,
    }  # fmt: skip


def _evidence_policy(*feats: Any) -> dict[str, Any]:
    """The learned policy `gold` whose status holds a finding for each features' class."""
    classes: dict[str, list[dict[str, Any]]] = {}
    for f in feats:
        classes.setdefault(knob_experiment.cohort_of(f)[0], []).append(_finding_for(f))
    hw = [{"hardwareClass": k, "findings": v} for k, v in classes.items()]
    return {
        "metadata": {"name": "gold"},
        "spec": {},
        "status": {"learning": {"hardwareClasses": hw}},
    }


def test_a_running_jobs_table_keeps_the_evidence_it_was_compiled_with(
    pytorchjob: Job, pods_on: Callable[..., list[dict[str, Any]]], kwok_nodes: dict[str, Any]
) -> None:
    """The class's evidence changes while the job runs (its sidecars loaded the table when
    they started): reconciled again with the same features, policy and model, the job keeps
    the table and the `measuredCells` it was compiled with; once what it is compiled for
    changes (its pods bound: observed features) it is compiled from the evidence of then."""
    job = pytorchjob()
    first = reconcile.decide(_inputs(job, kwok_nodes))
    assert first is not None
    assert first.config_map is not None
    assert first.decision.features is not None
    bound_inputs = dataclasses.replace(
        _inputs(job, kwok_nodes), pods=pods_on(job, ["gpu-h100-00", "gpu-h100-01"]),
        nodes=kwok_nodes,
    )  # fmt: skip
    probe = reconcile.decide(bound_inputs)
    assert probe is not None
    assert probe.decision.features is not None
    assert probe.decision.features != first.decision.features
    policy = _evidence_policy(first.decision.features, probe.decision.features)
    later = dataclasses.replace(
        _inputs_for(job, kwok_nodes, policy), previous_config=first.config_map
    )
    again = reconcile.decide(later)
    assert again is not None
    assert again.config_map is not None
    assert again.config_map["data"]["table.json"] == first.config_map["data"]["table.json"]
    assert again.tuning_run["spec"]["measuredCells"] == []
    # the code before kept nothing: the same inputs without the ConfigMap take the finding
    fresh = reconcile.decide(_inputs_for(job, kwok_nodes, policy))
    assert fresh is not None
    assert len(fresh.tuning_run["spec"]["measuredCells"]) == 1
    bound = reconcile.decide(
        dataclasses.replace(
            later, pods=bound_inputs.pods, nodes=kwok_nodes, previous_config=again.config_map
        )
    )
    assert bound is not None
    assert bound.config_map is not None
    (line,) = bound.tuning_run["spec"]["measuredCells"]
    assert "allreduce/b26" in line
    assert "tree/simple" in line
    # a ConfigMap whose table was edited (its digest no longer matches) is compiled afresh
    edited = json.loads(json.dumps(again.config_map))
    edited["data"]["table.json"] = edited["data"]["table.json"].replace('"version"', '"versiom"')
    redo = reconcile.decide(dataclasses.replace(later, previous_config=edited))
    assert redo is not None
    assert len(redo.tuning_run["spec"]["measuredCells"]) == 1

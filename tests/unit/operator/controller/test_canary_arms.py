"""A canary job measures both versions' choices itself (issue 29), through the operator's
decision: its table explores the promoted version's choice where the two tables differ, and
its record (TuningRun, job.json) lists those cells for the canary judge.

Stand-in: the model registry (`_two_versions` compiles a hand-written table per version, as
`model_fetch.RegistryCompiler` would from two model files); the decision, the table builder,
the exploration assignment and the arms are the operator's."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import Cell, Choice, DecisionTable, scale_class
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller import reconcile
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.policy.runtime.arms import ARM_RATE

Job = Callable[..., dict[str, Any]]
FIRST = {
    "v1": Choice(algo=Algo.RING, proto=Proto.LL),
    "v2": Choice(algo=Algo.TREE, proto=Proto.LL128),
}


def _two_versions(feats: StateFeatures, policy: NCCLTuningPolicySpec, version: str) -> Any:
    scale = scale_class(feats.world_size, feats.topology.nodes)
    cells = (
        Cell(collective=Collective.ALLREDUCE, bucket=25, scale=scale, choices=(FIRST[version],)),
        Cell(collective=Collective.ALLREDUCE, bucket=20, scale=scale, choices=(FIRST["v1"],)),
    )
    return DecisionTable(version=1, scales=(scale,), cells=cells)


def _inputs(job: dict[str, Any], kwok: dict[str, Any], percent: int) -> reconcile.Inputs:
    rollout = {"promoted": "v1", "canary": "v2", "canaryPercent": percent}
    policy = {"metadata": {"name": "gold"}, "spec": {"mode": "learned"},
              "status": {"learning": {"rollout": rollout}}}  # fmt: skip
    pols, errs = parse_policies([policy])
    return reconcile.Inputs(
        job=job, namespace_labels={}, policies=pols, policy_errors=errs,
        cluster_nodes=list(kwok.values()), compiler=_two_versions,
    )  # fmt: skip


def _cell(out: reconcile.Outcome, bucket: int) -> dict[str, Any]:
    assert out.config_map is not None
    table = json.loads(out.config_map["data"]["table.json"])
    (cell,) = [c for c in table["cells"] if c["bucket"] == bucket]
    return dict(cell)


def test_a_canary_job_explores_the_promoted_choice_where_the_versions_differ(
    pytorchjob: Job, kwok_nodes: dict[str, Any]
) -> None:
    job = pytorchjob()
    out = reconcile.decide(_inputs(job, kwok_nodes, 100))
    assert out is not None
    assert (out.decision.model_version, out.decision.canary) == ("v2", True)
    armed = _cell(out, 25)
    assert armed["choices"][0]["algo"] == "tree"  # it runs the canary's choice
    assert (armed["candidates"][0]["algo"], armed["candidates"][0]["proto"]) == ("ring", "ll")
    assert armed["explore"] >= ARM_RATE
    assert "candidates" not in _cell(out, 20) or not _cell(out, 20)["candidates"]
    spec = out.tuning_run["spec"]
    assert spec["armsBaseline"] == "v1"
    (arm,) = spec["arms"]
    assert (arm["sizeBucket"], arm["choice"]["algo"], arm["baseline"]["algo"]) == (
        25,
        "tree",
        "ring",
    )
    assert out.config_map is not None
    meta = json.loads(out.config_map["data"]["job.json"])
    assert (meta["arms_baseline"], len(meta["arms"])) == ("v1", 1)
    # reconciled again, the job keeps its table and its arms (its sidecars loaded them)
    again = reconcile.decide(dataclasses.replace(_inputs(job, kwok_nodes, 100),
                                                 previous_config=out.config_map))  # fmt: skip
    assert again is not None
    assert again.config_map is not None
    assert again.config_map["data"] == out.config_map["data"]
    assert again.tuning_run["spec"]["arms"] == spec["arms"]


def test_a_job_of_the_promoted_version_has_no_arms(
    pytorchjob: Job, kwok_nodes: dict[str, Any]
) -> None:
    out = reconcile.decide(_inputs(pytorchjob(), kwok_nodes, 0))
    assert out is not None
    assert (out.decision.model_version, out.decision.canary) == ("v1", False)
    assert "arms" not in out.tuning_run["spec"] or out.tuning_run["spec"]["arms"] == []
    assert not _cell(out, 25).get("candidates")

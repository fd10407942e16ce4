"""Issue 32 A: no admission policy of the chart can be switched off by its objects' writers.

A policy stops applying when its writer changes what selects it. The coordination policy
selected its ConfigMaps by a label, and one of the job's own pods removed that label:
afterwards neither the old nor the new object matched, and any pod of the ServiceAccount
wrote into it. These tests read the rendered chart (helm template) and check that every
policy is selected only by what a writer cannot change (its own identity, the request's
resource, the object's name), that the coordination names are exactly those the policy
selects, and that the labels and the pattern stay the operator's. The same attacks run
on a real apiserver in tests/integration/operator/test_policy_escape_kube.py.
"""

from __future__ import annotations

import re
from typing import Any

from dynamiccl.api import sidecar_objects
from dynamiccl.operator.controller import configmap
from tests.unit.operator.test_chart import _kind, _template

WRITER_SET = ("object.", "oldObject.")


def _policies() -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d["spec"] for d in _kind(_template(), "ValidatingAdmissionPolicy")
    }


def test_no_policy_is_selected_by_what_its_writers_write() -> None:
    policies = _policies()
    assert set(policies) == {
        "t-dynamiccl-node-agent",
        "t-dynamiccl-ingest-jobs",
        "t-dynamiccl-coordination",
        "t-dynamiccl-job-config",
    }
    for name, spec in policies.items():
        constraints = spec["matchConstraints"]
        assert "objectSelector" not in constraints, name  # labels: the writer's to change
        assert "namespaceSelector" not in constraints, name
        for cond in spec.get("matchConditions", []):
            expr = cond["expression"]
            assert not any(w in expr for w in WRITER_SET), (name, cond["name"])
            assert "request.userInfo" in expr or "request.name" in expr, (name, cond["name"])


def _suffixes(spec: dict[str, Any]) -> list[str]:
    [cond] = [c for c in spec["matchConditions"] if c["name"] == "a-coordination-configmap"]
    return re.findall(r"'(-dynamiccl-[a-z]+)'", cond["expression"])


def test_the_coordination_policy_selects_exactly_the_coordination_names() -> None:
    """By name: names never change, and every name the operator gives ends so (long job
    names are shortened with a digest before the suffix)."""
    suffixes = _suffixes(_policies()["t-dynamiccl-coordination"])
    assert len(suffixes) == 3
    for job in ("llm", "a" * 250, "x.y-z"):
        names = sidecar_objects.coordination_names(job)
        assert all(any(n.endswith(s) for s in suffixes) for n in names), names
        assert sorted(n.rsplit("-", 1)[1] for n in names) == sorted(
            s.rsplit("-", 1)[1] for s in suffixes
        )
    # the job's own configuration ConfigMap (the webhook's) is not a coordination object
    assert not any("llm-dynamiccl".endswith(s) for s in suffixes)


def test_the_coordination_policy_selects_every_ballot_object_and_only_those() -> None:
    """Ballot objects (`<job>-dynamiccl-votes-<g>`) are selected by name like the other
    three, and a pod may write only its own key of one (the attacks:
    tests/integration/operator/test_trust_boundaries_kube.py)."""
    spec = _policies()["t-dynamiccl-coordination"]
    [cond] = [c for c in spec["matchConditions"] if c["name"] == "a-coordination-configmap"]
    (pattern,) = re.findall(r"request\.name\.matches\('([^']+)'\)", cond["expression"])
    for job in ("llm", "a" * 250):
        for name in sidecar_objects.votes_names(job, 2000):
            assert re.search(pattern, name), name
    for other in ("llm-dynamiccl-votes-", "llm-dynamiccl-votes-1x", "llm-dynamiccl"):
        assert not re.search(pattern, other)
    rules = [v["expression"] for v in spec["validations"]]
    [own] = [r for r in rules if "variables.ballots" in r]
    assert "k == variables.pod" in own  # every other key unchanged, none removed
    assert "!has(object.binaryData)" in own


def test_the_coordination_policy_keeps_labels_pattern_and_existence_the_operators() -> None:
    spec = _policies()["t-dynamiccl-coordination"]
    ops = spec["matchConstraints"]["resourceRules"][0]["operations"]
    assert set(ops) == {"CREATE", "UPDATE", "DELETE"}  # a delete and re-create is no escape
    rules = [v["expression"] for v in spec["validations"]]
    assert any("object.metadata.labels" in r and "oldObject.metadata.labels" in r for r in rules)
    assert any("'dynamiccl.io/writer-pods' in object.metadata.annotations" in r for r in rules)
    assert any(r.strip() == "request.operation == 'UPDATE'" for r in rules)
    conds = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert "t-dynamiccl-operator" in conds["not-the-operator"]


def test_the_node_agent_names_only_its_own_node_in_a_node_topology() -> None:
    """Issue 32, smaller finding: spec.nodeName set to another node's name."""
    spec = _policies()["t-dynamiccl-node-agent"]
    rules = [v["expression"] for v in spec["validations"]]
    assert any("object.spec.nodeName == variables.node" in r for r in rules)


def test_only_the_operator_writes_a_jobs_configuration() -> None:
    """Issue 32 C: a tenant with `edit` rewrote `<job>-dynamiccl`'s env.json and the webhook
    injected it. Every write of a `-dynamiccl` ConfigMap is refused but the operator's (and
    the cluster's controllers'); the names the operator gives end so."""
    spec = _policies()["t-dynamiccl-job-config"]
    ops = spec["matchConstraints"]["resourceRules"][0]["operations"]
    assert set(ops) == {"CREATE", "UPDATE", "DELETE"}
    conds = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert conds["a-job-configuration"] == "request.name.endsWith('-dynamiccl')"
    assert (
        '"system:serviceaccount:dynamiccl-system:t-dynamiccl-operator"' in conds["not-the-operator"]
    )
    others = conds["not-the-clusters-controllers-or-admins"]
    assert "system:serviceaccount:kube-system:" in others
    assert "'system:masters' in request.userInfo.groups" in others
    assert [v["expression"] for v in spec["validations"]] == ["false"]
    for job in ("llm", "b" * 250):
        assert configmap.object_name(job).endswith("-dynamiccl")

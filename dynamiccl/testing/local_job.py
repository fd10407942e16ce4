"""A job through the operator without an API server: created, decided on, its pods admitted.

For tools that run a job's pods as local processes (`local_pods.py`; `hack/gpu_ddp.py` runs
real PyTorch DDP ranks on a GPU that way). The sequence a cluster goes through, with the
operator's own functions:

1. the job object is created (the API server gives it a uid);
2. the operator decides (`operator/controller/reconcile.py`): annotations, policy
   selection, state features estimated from the cluster's nodes (pods not
   scheduled yet), model version, the ConfigMap with the compiled table, the
   TuningRun;
3. the training operator creates the pods from the job's templates; each pod
   CREATE goes through the admission webhook (`operator/webhook/server.py` —
   `Admission.review` on an AdmissionReview, the JSON patch applied to the
   pod), which mutates it because the job's ConfigMap exists;
4. the scheduler binds the pods; the operator decides again with the bound
   pods (tiers observed, `scheduled: true`) and updates the ConfigMap before
   the containers start.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jsonpatch
import yaml

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import Mode
from dynamiccl.operator.controller import configmap, reconcile
from dynamiccl.operator.controller.cache import ObjectCache
from dynamiccl.operator.controller.policy_match import Policy, parse_policies
from dynamiccl.operator.webhook import server as webhook
from dynamiccl.testing.sim_cluster import PodPlan, new_uid, node_topologies, nodes, pods, with_uid

EXAMPLES: Final = Path(__file__).resolve().parents[2] / "examples"
POLICIES: Final = EXAMPLES / "policies"
JOB: Final = EXAMPLES / "pytorchjob.yaml"  # the annotated sample job
LEARNED_POLICY: Final = "ml-learned"
NAMESPACE_LABELS: Final = {"team": "ml"}  # the job's namespace: selected by ml-learned
IMAGE: Final = "ghcr.io/dynamiccl/dynamiccl:0.1.0"


class LocalJobError(RuntimeError):
    """The operator did not tune the job, or the sample policies cannot tune it (the message
    says why)."""


def load_policies() -> list[dict[str, Any]]:
    """The sample policies (`examples/policies/`) as API objects. One change: `ml-learned`
    starts from `default` alone and retrains as soon as a job reported, its canary serving
    every new job (a cluster waits for 10 000 rewards or the night, and canaries 10 %)."""
    docs = [yaml.safe_load(p.read_text()) for p in sorted(POLICIES.glob("*.yaml"))]
    for doc in docs:
        name = doc["metadata"]["name"]
        doc["metadata"].update(uid=f"{name}-uid", creationTimestamp="2026-01-01T00:00:00Z")
        if name == LEARNED_POLICY:
            doc["spec"]["model"] = {"version": "default"}
            doc["spec"]["retraining"] = {"minNewExperience": 1, "canaryPercent": 100}
    policies, errors = parse_policies(docs)
    if errors:
        raise LocalJobError("; ".join(errors))
    learned = next((p for p in policies if p.name == LEARNED_POLICY), None)
    if learned is None or learned.spec.mode is not Mode.LEARNED:
        raise LocalJobError(f"{POLICIES}: no learned policy {LEARNED_POLICY}")
    return docs


@dataclass(frozen=True)
class Cluster:
    """The simulated cluster's objects the operator reads."""

    spec: TopologySpec
    namespace: str
    namespace_labels: Mapping[str, str]
    nodes: tuple[dict[str, Any], ...]
    node_topologies: Mapping[str, Mapping[str, Any]]

    @classmethod
    def of(cls, spec: TopologySpec, namespace: str, labels: Mapping[str, str]) -> Cluster:
        """Nodes and NodeTopology objects for a topology."""
        return cls(spec, namespace, dict(labels), tuple(nodes(spec)), node_topologies(spec))


@dataclass(frozen=True)
class Incarnation:
    """One run of the job: its objects as the cluster holds them once the pods are bound."""

    job: dict[str, Any]
    config_map: dict[str, Any]
    tuning_run: dict[str, Any]
    estimated: StateFeatures  # before scheduling
    features: StateFeatures  # with the pods bound
    pods: tuple[dict[str, Any], ...]  # mutated by the webhook, bound
    plans: tuple[PodPlan, ...]
    model_version: str
    canary: bool
    policy_name: str
    message: str

    @property
    def uid(self) -> str:
        """The job's uid."""
        return str(self.job["metadata"]["uid"])

    def table(self) -> dict[str, Any]:
        """The initial decision table in the ConfigMap."""
        out: dict[str, Any] = json.loads(self.config_map["data"][configmap.KEY_TABLE])
        return out


def _decide(inputs: reconcile.Inputs) -> reconcile.Outcome:
    outcome = reconcile.decide(inputs)
    if outcome is None:
        raise LocalJobError("the job is not opted in (dynamiccl.io/tune)")
    if outcome.config_map is None or not outcome.decision.tuned:
        raise LocalJobError(f"{outcome.decision.reason}: {outcome.decision.message}")
    return outcome


def admit(
    pod: Mapping[str, Any], config_map: Mapping[str, Any], image: str, ingest_url: str
) -> dict[str, Any]:
    """The pod after the admission webhook's answer to its CREATE (patch applied)."""
    cache = ObjectCache()
    cache.on_event("ADDED", dict(config_map))
    adm = webhook.Admission(config_maps=cache, image=image, ingest_url=ingest_url)
    meta = pod["metadata"]
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": meta["uid"],
            "operation": "CREATE",
            "namespace": meta["namespace"],
            "object": dict(pod),
        },
    }
    resp = asyncio.run(adm.review(review))["response"]
    if not resp.get("allowed"):
        raise LocalJobError(f"pod {meta['name']} was not admitted")
    if "patch" not in resp:
        return dict(pod)
    patch = json.loads(base64.b64decode(resp["patch"]))
    out: dict[str, Any] = jsonpatch.apply_patch(dict(pod), patch)
    return out


def create(
    manifest: Mapping[str, Any],
    cluster: Cluster,
    policies: Sequence[Policy],
    *,
    rng: random.Random,
    image: str,
    ingest_url: str,
    ingest_ca: str,
    compiler: configmap.Compiler,
) -> Incarnation:
    """Create the job and its pods in the simulated cluster (steps 1-4 of the module doc)."""
    job = with_uid(manifest, new_uid(rng))
    job["metadata"].setdefault("namespace", cluster.namespace)
    base = reconcile.Inputs(
        job=job,
        namespace_labels=cluster.namespace_labels,
        policies=policies,
        cluster_nodes=cluster.nodes,
        node_topologies=cluster.node_topologies,
        ingest_ca=ingest_ca,
        compiler=compiler,
    )
    first = _decide(base)
    assert first.config_map is not None
    created, plans = pods(job, cluster.spec, rng)
    admitted = [admit(p, first.config_map, image, ingest_url) for p in created]
    bound = _decide(
        reconcile.Inputs(
            **{
                **base.__dict__,
                "pods": admitted,
                "nodes": {n["metadata"]["name"]: n for n in cluster.nodes},
            }
        )
    )
    assert bound.config_map is not None
    d = bound.decision
    assert first.decision.features is not None
    assert d.features is not None
    return Incarnation(
        job=job,
        config_map=bound.config_map,
        tuning_run=bound.tuning_run,
        estimated=first.decision.features,
        features=d.features,
        pods=tuple(admitted),
        plans=tuple(plans),
        model_version=d.model_version or "",
        canary=d.canary,
        policy_name=d.policy_name or "",
        message=d.message,
    )

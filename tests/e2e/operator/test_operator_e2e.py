"""The operator end to end on the local control plane (issue #4, "Must show").

``helm install`` of charts/dynamiccl (see conftest.py: the operator runs as a
local process with the chart's own arguments) → training jobs created as a user
would → the REAL Kubeflow training operator creates the pods → the apiserver
calls our webhook → kube-scheduler binds the pods to kwok GPU nodes. Checked:
every pod of an annotated PyTorchJob / MPIJob carries the native sidecar, the
plugin init step, the volumes and the env; the TuningRun's state features match
the labels (hack/nodes.yaml) of the nodes the pods landed on; an unannotated
job's pods are untouched; deleting a job garbage-collects its ConfigMap and
TuningRun; malformed annotations give an Event and a condition and the job runs
untuned; ``kubectl apply`` of an invalid NCCLTuningPolicy fails naming the
field; with the webhook down or hanging, pods are still created, untuned.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from itertools import combinations
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from dynamiccl import constants as c
from dynamiccl.testing import scripts
from dynamiccl.testing.waiting import wait_for
from tests.e2e.operator.jobs import (
    MPI,
    PT,
    assert_untouched,
    create,
    gone,
    mpijob,
    pytorchjob,
    running_pods,
    scheduled_run,
    tuning_run,
)
from tests.e2e.operator.release import NTP, Release

SIDECAR, INSTALL = "dynamiccl-sidecar", "dynamiccl-install-plugin"
VOLUMES = {"dynamiccl-plugin", "dynamiccl-config", "dynamiccl-shm"}
H100 = "NVIDIA-H100-80GB-HBM3"


# --------------------------------------------------------------- expected topology
NODE_LABELS: dict[str, dict[str, str]] = {
    n["metadata"]["name"]: n["metadata"]["labels"] for n in scripts.load("gen_nodes").expand()
}


def _tier(a: str, b: str) -> str:
    la, lb = NODE_LABELS[a], NODE_LABELS[b]
    if a == b:
        return "same_node"
    if la[c.NODE_LABEL_ZONE] != lb[c.NODE_LABEL_ZONE]:
        return "cross_zone"
    if la[c.NODE_LABEL_TOPO_LEAF] == lb[c.NODE_LABEL_TOPO_LEAF]:
        return "same_rack"
    return "cross_rack"


def expected_topology(nodes_of_pods: list[str], ranks_per_pod: int) -> dict[str, Any]:
    """What the features must say, from hack/nodes.yaml alone (the tier of every rank pair)."""
    ranks = [n for n in nodes_of_pods for _ in range(ranks_per_pod)]
    pairs = Counter(_tier(a, b) for a, b in combinations(ranks, 2))
    total = sum(pairs.values())
    order = ["same_node", "same_rack", "cross_rack", "cross_zone"]
    ref = NODE_LABELS[sorted(set(nodes_of_pods))[0]]
    nvswitch = c.NODE_LABEL_TOPO_ACCELERATOR in ref
    model = ref[c.NODE_LABEL_GFD_PRODUCT].split("-")[1]
    return {
        "nodes": len(set(nodes_of_pods)),
        "tier_max": max(pairs, key=order.index),
        "tier_mix": {t: pairs[t] / total for t in order},
        "gpu": model,
        "intra": "nvswitch" if nvswitch else "pcie",
        "nvls": nvswitch and model == "H100",
        "fabric": "infiniband" if ref.get(c.NODE_LABEL_NFD_RDMA) == "true" else "ethernet",
        "heterogeneous": len({NODE_LABELS[n][c.NODE_LABEL_GFD_PRODUCT] for n in nodes_of_pods}) > 1,
    }


def assert_features_match_nodes(features: dict[str, Any], pods: list[Any], nproc: int) -> None:
    nodes = [p.spec.node_name for p in pods]
    want = expected_topology(nodes, nproc)
    topo = features["topology"]
    assert features["scheduled"] is True
    assert features["world_size"] == nproc * len(pods)
    assert (features["replicas"], features["nproc_per_node"]) == (len(pods), nproc)
    assert topo["nodes"] == want["nodes"], (nodes, topo)
    assert topo["tier_max"] == want["tier_max"], (nodes, topo)
    for tier, share in want["tier_mix"].items():
        assert topo["tier_mix"][tier] == pytest.approx(share, abs=1e-6), (tier, nodes, topo)
    for key in ("gpu", "intra", "nvls", "fabric"):
        assert topo[key] == want[key], (key, nodes, topo)
    assert ("heterogeneous_nodes" in features["unknown"]) == want["heterogeneous"]
    assert features["environment"]["container_boundary"] is False  # 8 of 8 GPUs per pod


# ------------------------------------------------------------------ pod checks
def assert_injected(pod: Any, release: Release, job: str, container: str) -> None:
    inits = {i.name: i for i in pod.spec.init_containers or []}
    assert {SIDECAR, INSTALL} <= set(inits), pod.metadata.name
    names = [i.name for i in pod.spec.init_containers]
    assert names.index(INSTALL) < names.index(SIDECAR)
    sidecar = inits[SIDECAR]
    assert sidecar.restart_policy == "Always"  # native sidecar
    assert sidecar.image == release.image
    assert sidecar.command == ["dynamiccl", "sidecar"]
    sc = sidecar.security_context
    assert sc.run_as_non_root is True
    assert sc.read_only_root_filesystem is True
    assert sc.allow_privilege_escalation is False
    assert sc.capabilities.drop == ["ALL"]
    assert sidecar.resources.requests == {"cpu": "50m", "memory": "64Mi"}
    vols = {v.name: v for v in pod.spec.volumes}
    assert set(vols) >= VOLUMES
    assert vols["dynamiccl-config"].config_map.name == f"{job}-dynamiccl"
    assert vols["dynamiccl-config"].config_map.optional is True
    assert vols["dynamiccl-shm"].empty_dir.medium == "Memory"
    ct = next(x for x in pod.spec.containers if x.name == container)
    env = {e.name: e.value for e in ct.env or []}
    assert env[c.ENV_NCCL_TUNER_PLUGIN].endswith(c.PLUGIN_LIBRARY)
    assert env[c.ENV_NCCL_PROFILER_PLUGIN] == env[c.ENV_NCCL_TUNER_PLUGIN]
    assert env["NCCL_NTHREADS"] == "256"  # the policy's per-job knob
    assert c.ENV_SHM_PATH in env
    mounts = {m.name for m in ct.volume_mounts or []}
    assert {"dynamiccl-plugin", "dynamiccl-shm"} <= mounts
    assert c.ANNOTATION_INJECTED in (pod.metadata.annotations or {})


# ------------------------------------------------------------------------ tests
def test_chart_registers_a_webhook_that_never_blocks_pods(release: Release) -> None:
    adm = k8s.AdmissionregistrationV1Api(release.api)
    mwc = adm.read_mutating_webhook_configuration(release.webhook_config)
    hooks = mwc.webhooks
    assert hooks is not None
    assert len(hooks) == 2
    for hook in hooks:
        assert hook.failure_policy == "Ignore"
        assert hook.timeout_seconds is not None
        assert hook.timeout_seconds <= 3
        assert hook.side_effects == "None"
        assert hook.reinvocation_policy == "IfNeeded"
        assert hook.client_config.url == f"https://127.0.0.1:{release.port}/mutate"
        assert hook.rules
        assert hook.rules[0].operations == ["CREATE"]
        assert hook.rules[0].resources == ["pods"]
    apps = k8s.AppsV1Api(release.api)
    deploy = apps.read_namespaced_deployment(
        f"{release.name}-dynamiccl-operator", release.namespace
    )
    assert deploy.spec.replicas == 2
    assert f"--peering={release.name}-dynamiccl" in release.chart_args  # HA via kopf peering


def test_annotated_pytorchjob_pods_are_injected_and_features_match_nodes(
    release: Release, tuned_namespace: str
) -> None:
    ns = tuned_namespace
    core = k8s.CoreV1Api(release.api)
    tuned = create(
        release,
        ns,
        PT,
        pytorchjob(
            "llm",
            {c.ANNOTATION_TUNE: "true", c.ANNOTATION_PARALLELISM: "fsdp"},
            env={"NCCL_ALGO": "Ring"},
            node_selector={c.NODE_LABEL_GFD_PRODUCT: H100},
        ),
    )
    create(release, ns, PT, pytorchjob("plain", {}))

    pods = running_pods(release, ns, "llm", 2)
    assert {p.metadata.labels[c.LABEL_KUBEFLOW_REPLICA_TYPE] for p in pods} == {"master", "worker"}
    for pod in pods:
        assert_injected(pod, release, "llm", "pytorch")
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["NCCL_ALGO"] == "Ring"  # the user's own NCCL env is never overridden
        assert env["WORLD_SIZE"] == "16"  # the training operator's env is intact
        user_env = json.loads(pod.metadata.annotations[c.ANNOTATION_USER_NCCL_ENV])
        assert user_env == {"NCCL_ALGO": "Ring"}
    for pod in running_pods(release, ns, "plain", 2):
        assert_untouched(pod)

    tr = scheduled_run(release, ns, "llm")
    features = tr["spec"]["features"]
    assert_features_match_nodes(features, pods, 8)
    assert features["workload"]["parallelism"] == "fsdp"
    conds = {x["type"]: x["status"] for x in tr["status"]["conditions"]}
    assert conds["Tuned"] == "True"
    assert conds["Scheduled"] == "True"
    assert tr["spec"]["policyName"] == release.policy
    cm = core.read_namespaced_config_map("llm-dynamiccl", ns)
    assert cm.metadata is not None
    assert cm.metadata.owner_references
    assert cm.data is not None
    assert cm.metadata.owner_references[0].uid == tuned["metadata"]["uid"]
    assert json.loads(cm.data["features.json"])["topology"] == features["topology"]
    assert json.loads(cm.data["env.json"]) == {"NCCL_NTHREADS": "256"}
    # The unannotated job got nothing at all.
    assert gone(lambda: tuning_run(release, ns, "plain"))
    assert gone(lambda: core.read_namespaced_config_map("plain-dynamiccl", ns))

    k8s.CustomObjectsApi(release.api).delete_namespaced_custom_object(
        *PT[:2], ns, PT[2], "llm", propagation_policy="Background"
    )
    wait_for(
        "ConfigMap garbage-collected",
        lambda: gone(lambda: core.read_namespaced_config_map("llm-dynamiccl", ns)),
    )
    wait_for("TuningRun garbage-collected", lambda: gone(lambda: tuning_run(release, ns, "llm")))


def test_annotated_mpijob_workers_are_injected_launcher_untouched(
    release: Release, tuned_namespace: str
) -> None:
    ns = tuned_namespace
    core = k8s.CoreV1Api(release.api)
    job = create(release, ns, MPI, mpijob("allreduce", {c.ANNOTATION_TUNE: "true"}))
    pods = running_pods(release, ns, "allreduce", 3)
    role = c.LABEL_KUBEFLOW_REPLICA_TYPE
    workers = [p for p in pods if p.metadata.labels[role] == "worker"]
    launcher = next(p for p in pods if p.metadata.labels[role] == "launcher")
    assert len(workers) == 2
    for pod in workers:
        assert_injected(pod, release, "allreduce", "worker")
    assert_untouched(launcher)  # runs no NCCL rank

    tr = scheduled_run(release, ns, "allreduce")
    assert tr["spec"]["jobRef"]["kind"] == "MPIJob"
    assert_features_match_nodes(tr["spec"]["features"], workers, 8)
    cm = core.read_namespaced_config_map("allreduce-dynamiccl", ns)
    assert cm.metadata is not None
    assert cm.metadata.owner_references
    assert cm.metadata.owner_references[0].uid == job["metadata"]["uid"]
    assert cm.metadata.owner_references[0].api_version == "kubeflow.org/v1"

    k8s.CustomObjectsApi(release.api).delete_namespaced_custom_object(
        *MPI[:2], ns, MPI[2], "allreduce", propagation_policy="Background"
    )
    wait_for(
        "ConfigMap garbage-collected",
        lambda: gone(lambda: core.read_namespaced_config_map("allreduce-dynamiccl", ns)),
    )
    wait_for(
        "TuningRun garbage-collected", lambda: gone(lambda: tuning_run(release, ns, "allreduce"))
    )


def test_malformed_annotations_event_condition_and_untuned_pods(
    release: Release, tuned_namespace: str
) -> None:
    ns = tuned_namespace
    core = k8s.CoreV1Api(release.api)
    bad = {c.ANNOTATION_TUNE: "true", c.ANNOTATION_MODEL_SIZE: "huge"}
    create(release, ns, PT, pytorchjob("bad", bad, gpus=1))

    def invalid() -> dict[str, Any] | None:
        conds = {
            x["type"]: x
            for x in tuning_run(release, ns, "bad").get("status", {}).get("conditions", [])
        }
        return conds if conds.get("AnnotationsValid", {}).get("status") == "False" else None

    conds = wait_for("AnnotationsValid=False", invalid)
    assert c.ANNOTATION_MODEL_SIZE in conds["AnnotationsValid"]["message"]
    assert "huge" in conds["AnnotationsValid"]["message"]
    assert conds["Tuned"]["status"] == "False"
    events = wait_for(
        "InvalidAnnotations Event on the job",
        lambda: [
            e
            for e in core.list_namespaced_event(ns).items
            if e.involved_object.name == "bad" and e.reason == "InvalidAnnotations"
        ],
    )
    assert events[0].type == "Warning"
    assert events[0].involved_object.kind == "PyTorchJob"
    for pod in running_pods(release, ns, "bad", 2):  # the job runs, untuned
        assert_untouched(pod)
    assert gone(lambda: core.read_namespaced_config_map("bad-dynamiccl", ns))


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (
            {"constraints": {"channels": {"min": 9, "max": 4}}},
            "spec.constraints.channels.min",
            "min must be <= max",
        ),
        ({"mode": "sometimes"}, "spec.mode", "Unsupported value"),
        (
            {"guardrails": {"regressionThreshold": 3}},
            "spec.guardrails.regressionThreshold",
            "less than or equal",
        ),
        ({"mode": "static", "bogus": 1}, "spec.bogus", "unknown field"),
    ],
)
def test_kubectl_apply_rejects_an_invalid_policy_naming_the_field(
    release: Release, spec: dict[str, Any], field: str, message: str
) -> None:
    name = f"{release.name}-invalid"
    doc: dict[str, Any] = {"apiVersion": "dynamiccl.io/v1alpha1", "kind": "NCCLTuningPolicy"}
    doc |= {"metadata": {"name": name}, "spec": spec}
    proc = subprocess.run(
        [release.kubectl, "--kubeconfig", release.kubeconfig, "apply", "-f", "-"],
        input=yaml.safe_dump(doc),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0, proc.stdout
    assert field in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr
    custom = k8s.CustomObjectsApi(release.api)
    assert gone(lambda: custom.get_cluster_custom_object(*NTP, name))

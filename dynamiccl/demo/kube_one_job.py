"""`make demo-cluster --one-job`: one PyTorchJob whose pods' sidecars and ranks run here.

The single-job story of `dynamiccl.demo.kube_driver`: the example PyTorchJob, the
pods' real sidecars (`dynamiccl sidecar --coordination kube`: the epoch record
in ConfigMaps on the apiserver) and 8 rank processes per pod on the real
plugin, rewards through TokenReview-checked tokens to the ingest.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from dynamiccl import constants as c
from dynamiccl.demo.job import Incarnation
from dynamiccl.demo.kube_driver import Cluster, _obj, _say, ensure_namespace
from dynamiccl.demo.kube_manifests import (
    NAMESPACE,
    POLICY,
    demo_policy,
    job_manifest,
    plans,
    sidecar_command,
)
from dynamiccl.demo.pipeline import plugin_lib
from dynamiccl.demo.run import RunConfig, run
from dynamiccl.demo.workload import STEP, build_time_table


def create_job(cl: Cluster) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Namespace, policy, the PyTorchJob (suspended until its ConfigMap exists), bound pods."""
    ensure_namespace(cl)
    cl.apply(demo_policy())
    job = job_manifest()
    name = job["metadata"]["name"]
    k = ["--kubeconfig", cl.kubeconfig, "-n", NAMESPACE]
    cl.sh(cl.kubectl, *k, "delete", "pytorchjob", name, "--ignore-not-found", "--wait=true")
    job["spec"]["runPolicy"] = {"suspend": True}  # no pods before the operator decided
    _say(f"kubectl apply -f examples/pytorchjob.yaml (namespace {NAMESPACE})")
    cl.apply(job)
    cm_name = f"{name}-dynamiccl"
    cl.wait("the job's ConfigMap", lambda: cl.core.read_namespaced_config_map(cm_name, NAMESPACE))
    patch = json.dumps({"spec": {"runPolicy": {"suspend": False}}})
    cl.sh(cl.kubectl, *k, "patch", "pytorchjob", name, "--type=merge", "-p", patch)
    sel = f"{c.LABEL_KUBEFLOW_JOB_NAME}={name}"

    def running() -> list[Any]:
        items = cl.core.list_namespaced_pod(NAMESPACE, label_selector=sel).items
        ok = len(items) == 2 and all(p.status.phase == "Running" for p in items)
        return items if ok else []

    pods = [_obj(cl, p) for p in cl.wait("2 Running pods", running)]
    tr_api = (c.GROUP, c.API_VERSION, NAMESPACE, "tuningruns", cm_name)
    cl.wait(
        "the TuningRun refined from the bound pods",
        lambda: cl.custom.get_namespaced_custom_object(*tr_api)["spec"]["features"]["scheduled"],
    )
    cm = _obj(cl, cl.core.read_namespaced_config_map(cm_name, NAMESPACE))
    obj = dict(
        cl.custom.get_namespaced_custom_object("kubeflow.org", "v1", NAMESPACE, "pytorchjobs", name)
    )
    return obj, pods, cm


def one_job(cl: Cluster, out: Path, steps: int) -> None:
    """The single-job story: one PyTorchJob, its pods' real sidecars and 8 ranks each."""
    from dynamiccl.api.features import StateFeatures  # noqa: PLC0415

    k = [cl.kubectl, "--kubeconfig", cl.kubeconfig, "-n", NAMESPACE]
    job, pods, cm = create_job(cl)
    print(cl.sh(*k, "get", "pods", "-o", "wide"), flush=True)
    print(cl.sh(*k, "get", "tuningrun"), flush=True)
    features = StateFeatures.model_validate_json(cm["data"]["features.json"])
    times = build_time_table(features.topology.spec())
    times.write(out / "times.json")
    tr = dict(cl.custom.get_namespaced_custom_object(
        c.GROUP, c.API_VERSION, NAMESPACE, "tuningruns", cm["metadata"]["name"]))  # fmt: skip
    meta = json.loads(cm["data"]["job.json"])
    inc = Incarnation(
        job=job, config_map=cm, tuning_run=tr, estimated=features, features=features,
        pods=tuple(pods), plans=tuple(plans(pods, features.nproc_per_node)),
        model_version=str(meta.get("model_version", "")), canary=bool(meta.get("canary")),
        policy_name=POLICY, message="",
    )  # fmt: skip
    _say(f"playing the pods here: 2 sidecars + {features.world_size} ranks on the real plugin")
    cfg = RunConfig(
        steps=steps, seed=1, time_table=out / "times.json", image_lib=plugin_lib(),
        ops=[(o.collective.nccl_id, o.nbytes, o.repeat) for o in STEP],
        sidecar=sidecar_command(cl.kubeconfig, out / "tls" / "ca.crt"),
    )  # fmt: skip
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 5 or done == total:
            last[0] = time.monotonic()
            _say(f"{done}/{total} collective calls")

    run(inc, cfg, out / "run", cl.token, progress)
    name = cm["metadata"]["name"]
    tr_api = (c.GROUP, c.API_VERSION, NAMESPACE, "tuningruns", name)
    cl.wait(
        "the learning loop to write the TuningRun's reward",
        lambda: (
            (cl.custom.get_namespaced_custom_object(*tr_api).get("status") or {})
            .get("reward", {})
            .get("speedup")
        ),
        timeout=120,
    )
    print(cl.sh(*k, "get", "tuningrun"), flush=True)
    _say(f"kubectl -n {NAMESPACE} get tuningrun {name} -o yaml   # the whole status")

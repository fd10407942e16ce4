"""The env-knob experiment against a REAL kube-apiserver and a real SQLite store.

TuningRuns as the operator writes them (each job's NCCL_NTHREADS arm) and
reward batches as the jobs' sidecars send them (10 jobs per arm and cohort;
on 256 threads they measure 10 % faster on H100, no different on A100) go in;
the loop's knob step, through the operator's adapter (`Kube`), records the
arms, compares, and writes the
policy's `status.envKnobs` through the status subresource — validated and
pruned by the repository's CRD schema. Reading the policy back as the operator
does, the next H100 job is assigned 256 threads ("adopted"), the next A100 job
the declared 512. Deleting the TuningRuns (the jobs finished) loses nothing.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dynamiccl.api.features import StateFeatures
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.kube import Kube
from dynamiccl.operator.learning import knob_loop
from dynamiccl.operator.learning.loop import POLICIES, TUNING_RUNS
from dynamiccl.operator.store.experience import open_store
from dynamiccl.policy.online import knob_experiment as kx
from tests.knob_samples import report_job, tuned_run
from tests.topology_samples import dgx_h100, h100_job

GROUP, VERSION = "dynamiccl.io", "v1alpha1"
H100 = StateFeatures.model_validate(h100_job(2))
A100 = StateFeatures.model_validate(
    h100_job(2) | {"topology": dgx_h100("a", 2, gpu="A100", nvls=False)}
)


@pytest.fixture
def env(api: k8s.ApiClient, tmp_path: Path) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    ns, policy = f"knobs-{suffix}", f"knobs-{suffix}"
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "nccltuningpolicies",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": policy},
            "spec": {
                "mode": "learned",
                "selector": {"namespaceSelector": {"matchLabels": {"never": suffix}}},
                "constraints": {
                    "envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256, 512], "default": 512}]
                },
                "exploration": {"envKnobJobPercent": 0},
            },
        },
    )
    store = open_store(f"sqlite:///{tmp_path / 'experience.db'}")
    try:
        yield {"ns": ns, "policy": policy, "custom": custom, "store": store}
    finally:
        store.close()
        custom.delete_cluster_custom_object(GROUP, VERSION, "nccltuningpolicies", policy)
        core.delete_namespace(ns)


def _job(ns: str, policy: str, uid: str, feats: StateFeatures, threads: int) -> dict[str, Any]:
    """The TuningRun the operator writes for a tuned job."""
    run = tuned_run(uid, {"NCCL_NTHREADS": str(threads)}, feats, namespace=ns, policy=policy)
    # no job object exists here: an owner reference to it would have the garbage collector
    # delete the TuningRun at once
    del run["metadata"]["ownerReferences"]
    return run


def _policy(env: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = env["custom"].get_cluster_custom_object(
        GROUP, VERSION, "nccltuningpolicies", env["policy"]
    )
    return obj


def test_a_faster_knob_value_is_adopted_through_the_policy_status(
    env: dict[str, Any], cluster_kubeconfig: Path
) -> None:
    ns, policy, custom, store = env["ns"], env["policy"], env["custom"], env["store"]
    rng = random.Random(3)
    names = []
    for i in range(10):
        for feats, threads, factor, tag in (
            (H100, 512, 1.0, "h-base"),
            (H100, 256, 0.9, "h-fast"),
            (A100, 512, 1.0, "a-base"),
            (A100, 256, 1.0, "a-same"),
        ):
            name = f"{tag}-{i}"
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "tuningruns", _job(ns, policy, name, feats, threads)
            )
            report_job(store, name, factor, rng, namespace=ns)
            names.append(name)
    kube = Kube(str(cluster_kubeconfig))

    def step(now: float) -> int:
        # the TuningRuns as the loop's status sync gets them back, every policy of the cluster
        runs = kube.list(TUNING_RUNS, ns)
        return knob_loop.step(
            store, kube, POLICIES, policies=kube.list(POLICIES), runs=runs, now=now
        )

    assert step(1_800_000_000.0) >= 1

    obj = _policy(env)
    (pol,), errors = parse_policies([obj])
    assert errors == []
    assert pol.env_knobs is not None  # written, and kept by the CRD's status schema
    assert pol.env_knobs.updated == "2027-01-15T08:00:00Z"
    h100 = pol.env_knobs.cohort(kx.cohort_of(H100)[0])
    a100 = pol.env_knobs.cohort(kx.cohort_of(A100)[0])
    assert h100 is not None
    assert a100 is not None
    assert h100.description == "H100 x8 nvswitch+nvls, infiniband 8x400G"
    assert [(a.jobs, a.state.value) for a in h100.arms] == [(10, "baseline"), (10, "better")]
    fast = h100.arms[1]
    assert fast.speedup is not None
    assert fast.low is not None
    assert fast.high is not None
    assert fast.low > 1.0
    assert fast.low < fast.speedup < fast.high
    assert 1.08 < fast.speedup < 1.14
    assert a100.adopted is None
    assert a100.arms[1].state.value == "exploring"

    # The operator's side: the next job of each cohort (no exploration in this policy).
    got = kx.assign(pol.spec, h100, kx.cohort_of(H100)[0], "uid-next-h100")
    assert got.env == {"NCCL_NTHREADS": "256"}
    assert got.reason.startswith("adopted in cohort")
    got = kx.assign(pol.spec, a100, kx.cohort_of(A100)[0], "uid-next-a100")
    assert got.env == {"NCCL_NTHREADS": "512"}

    # The jobs finish and their TuningRuns go: the store still has their arms.
    for name in names:
        custom.delete_namespaced_custom_object(
            GROUP, VERSION, ns, "tuningruns", f"job-{name}-dynamiccl"
        )
    assert kube.list(TUNING_RUNS, ns) == []
    assert step(1_800_000_100.0) == 0
    assert _policy(env)["status"]["envKnobs"] == obj["status"]["envKnobs"]

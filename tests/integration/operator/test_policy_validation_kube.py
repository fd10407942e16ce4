"""Issue 19, item 10: bad schedules and knob values are refused, against a REAL apiserver.

Env-knob values outside NCCL's documented ranges are refused by the CRD itself
(CEL rules generated from dynamiccl/api/tuning_policy.py): `kubectl apply`
answers 422 naming the field. A cron schedule that cannot be parsed or never
fires passes the CRD (CEL cannot run cron; the pattern only checks the shape),
so the model's validator (cronsim) refuses it where policies are read: the
operator's policy matching reports the policy invalid, and the learning loop
ignores it instead of failing on it every pass.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl.api.knob_experiment import KnobName
from dynamiccl.api.knob_ranges import KNOB_VALUES
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.kube import Kube
from dynamiccl.operator.learning.loop import POLICIES, LearningLoop, LoopConfig
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.registry import ModelRegistry
from tests.knob_samples import OUTSIDE_NCCL_RANGE

GROUP, VERSION, PLURAL = "dynamiccl.io", "v1alpha1", "nccltuningpolicies"


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.fixture
def created(api: k8s.ApiClient) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    custom = k8s.CustomObjectsApi(api)
    for name in names:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def knobs(name: str, allowed: list[int]) -> dict[str, Any]:
    return {"constraints": {"envKnobs": [{"name": name, "allowed": allowed}]}}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (knobs("NCCL_BUFFSIZE", [16 << 30]), "NCCL_BUFFSIZE"),
        (knobs("NCCL_BUFFSIZE", [3 << 20]), "NCCL_BUFFSIZE"),  # not a power of 2
        (knobs("NCCL_NTHREADS", [0]), "NCCL_NTHREADS"),
        (knobs("NCCL_NTHREADS", [7]), "NCCL_NTHREADS"),
        (knobs("NCCL_NTHREADS", [256, 1024]), "NCCL_NTHREADS"),
        (knobs("NCCL_MAX_NCHANNELS", [65]), "NCCL_MAX_NCHANNELS"),
        *(
            (knobs(k.value, [bad]), k.value)
            for k, bads in OUTSIDE_NCCL_RANGE.items()
            for bad in bads
        ),
    ],
)
def test_knob_values_outside_nccls_range_are_rejected_by_the_apiserver(
    api: k8s.ApiClient, created: list[str], spec: dict[str, Any], field: str
) -> None:
    name = f"knob-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ApiException) as err:
        k8s.CustomObjectsApi(api).create_cluster_custom_object(
            GROUP, VERSION, PLURAL, policy(name, spec)
        )
    assert err.value.status == 422
    assert field in str(err.value.body)
    assert "NCCL's documented range" in str(err.value.body)


def test_an_arm_over_nccls_socket_limit_is_rejected_by_the_apiserver(
    api: k8s.ApiClient, created: list[str]
) -> None:
    """Moving NCCL_NSOCKS_PERTHREAD to 8 with the default 16 threads: 128 sockets."""
    spec = knobs("NCCL_SOCKET_NTHREADS", [4, 16])
    spec["constraints"]["envKnobs"][0]["default"] = 16
    spec["constraints"]["envKnobs"].append(
        {"name": "NCCL_NSOCKS_PERTHREAD", "allowed": [1, 8], "default": 1}
    )
    name = f"knob-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ApiException) as err:
        k8s.CustomObjectsApi(api).create_cluster_custom_object(
            GROUP, VERSION, PLURAL, policy(name, spec)
        )
    assert err.value.status == 422
    assert "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must not exceed 64" in str(err.value.body)


def test_documented_knob_values_are_accepted(api: k8s.ApiClient, created: list[str]) -> None:
    name = f"knob-ok-{uuid.uuid4().hex[:6]}"
    spec = knobs("NCCL_NTHREADS", [64, 256, 512])
    spec["constraints"]["envKnobs"].append({"name": "NCCL_BUFFSIZE", "allowed": [4 << 20]})
    spec["constraints"]["envKnobs"] += [
        {"name": k.value, "allowed": [KNOB_VALUES[k][0], KNOB_VALUES[k][-1]]}
        for k in OUTSIDE_NCCL_RANGE
        if k is not KnobName.NCCL_NSOCKS_PERTHREAD  # 16 threads x 64 sockets: over the limit
    ]
    NCCLTuningPolicySpec.model_validate(spec)  # the model accepts it too
    k8s.CustomObjectsApi(api).create_cluster_custom_object(
        GROUP, VERSION, PLURAL, policy(name, spec)
    )
    created.append(name)


@pytest.mark.parametrize("schedule", ["x x x x x", "0 0 31 2 *"])
def test_schedules_that_never_fire_are_refused_where_policies_are_read(
    api: k8s.ApiClient,
    cluster_kubeconfig: Path,
    created: list[str],
    tmp_path: Path,
    schedule: str,
) -> None:
    name = f"cron-{uuid.uuid4().hex[:6]}"
    spec = {"mode": "learned", "priority": 1000, "retraining": {"schedule": schedule}}
    custom = k8s.CustomObjectsApi(api)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, policy(name, spec))
    created.append(name)
    kube = Kube(str(cluster_kubeconfig))
    objs = [p for p in kube.list(POLICIES) if p["metadata"]["name"] == name]
    parsed, errors = parse_policies(objs)
    assert parsed == []
    assert any(name in e and "schedule" in e for e in errors), errors
    store = open_store(str(tmp_path / "experience.db"))
    try:
        loop = LearningLoop(
            store,
            ModelRegistry(store.backend),
            kube,
            LoopConfig(namespace="default", image="x", store_url="x", pvc_name="x"),
        )
        rep = loop.tick()
    finally:
        store.close()
    assert not [e for e in rep.errors if "cron" in e or "schedule" in e], rep.errors

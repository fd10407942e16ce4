"""Operator webhook + CRDs against a REAL kube-apiserver.

- the generated CRDs apply; an invalid NCCLTuningPolicy is rejected at create
  time with a message naming the field (CEL rule + structural schema);
- ``dynamiccl operator --no-handlers`` runs as a local process; the apiserver
  calls it through a MutatingWebhookConfiguration with
  ``clientConfig.url: https://127.0.0.1:<port>/mutate`` (the test-only
  equivalent of the chart's ``webhook.url`` value), whose caBundle the operator
  fills in itself (self-managed certificate);
- a pod of a job that has a ConfigMap gets the sidecar; a pod of another job is
  untouched; with the webhook process stopped, pods are still created, untuned.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.testing import builders
from dynamiccl.testing.ports import free_port

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def crds(admin_api: k8s.ApiClient) -> None:
    ext = k8s.ApiextensionsV1Api(admin_api)
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            cur = ext.read_custom_resource_definition(body["metadata"]["name"])
            assert cur.metadata is not None
            body["metadata"]["resourceVersion"] = cur.metadata.resource_version
            ext.replace_custom_resource_definition(body["metadata"]["name"], body)
    deadline = time.time() + 30
    custom = k8s.CustomObjectsApi(admin_api)
    while time.time() < deadline:
        try:
            custom.list_cluster_custom_object("dynamiccl.io", "v1alpha1", "nccltuningpolicies")
            return
        except ApiException:
            time.sleep(0.5)
    pytest.fail("NCCLTuningPolicy CRD never became served")


@pytest.fixture
def namespace(admin_api: k8s.ApiClient) -> Iterator[str]:
    name = f"dyn-op-{uuid.uuid4().hex[:6]}"
    core = k8s.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]  # the client takes dict bodies
    yield name
    core.delete_namespace(name)


def _policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "dynamiccl.io/v1alpha1",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.mark.usefixtures("crds")
def test_invalid_policy_is_rejected_naming_the_field(admin_api: k8s.ApiClient) -> None:
    custom = k8s.CustomObjectsApi(admin_api)
    cases: list[tuple[dict[str, Any], str, str]] = [
        (
            {"constraints": {"channels": {"min": 9, "max": 4}}},
            "spec.constraints.channels.min",
            "min must be <= max",
        ),
        (
            {"model": {"version": "v1", "canaryPercent": 5}},
            "spec.model.canaryVersion",
            "canaryVersion is required",
        ),
        ({"mode": "sometimes"}, "spec.mode", "Unsupported value"),
        (
            {"guardrails": {"regressionThreshold": 3}},
            "spec.guardrails.regressionThreshold",
            "less than or equal",
        ),
    ]
    for spec, field, message in cases:
        with pytest.raises(ApiException) as info:
            custom.create_cluster_custom_object(
                "dynamiccl.io", "v1alpha1", "nccltuningpolicies", _policy("bad", spec)
            )
        assert info.value.status == 422, info.value.body
        assert info.value.body is not None
        text = json.loads(info.value.body)["message"]
        assert field in text, text
        assert message in text, text
    name = f"ok-{uuid.uuid4().hex[:6]}"
    created = cast(  # the custom-objects API returns the object's JSON
        dict[str, Any],
        custom.create_cluster_custom_object(
            "dynamiccl.io", "v1alpha1", "nccltuningpolicies", _policy(name, {"mode": "static"})
        ),
    )
    try:
        assert created["spec"]["exploration"]["budgetCalls"] == 200  # schema default
    finally:
        custom.delete_cluster_custom_object("dynamiccl.io", "v1alpha1", "nccltuningpolicies", name)


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"operator exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail("operator webhook never became ready")


def _spec(pod: k8s.V1Pod) -> k8s.V1PodSpec:
    """The spec of a pod the apiserver returned (it always has one)."""
    assert pod.spec is not None
    return pod.spec


def _pod(name: str, job: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {c.LABEL_KUBEFLOW_JOB_NAME: job}},
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "example.invalid/train:1",
                    "env": [{"name": "NCCL_ALGO", "value": "Ring"}],
                }
            ]
        },
    }


@pytest.mark.usefixtures("crds")
def test_webhook_mutates_pods_of_tuned_jobs_only(
    cluster_kubeconfig: Path, admin_api: k8s.ApiClient, namespace: str
) -> None:
    kubeconfig = str(cluster_kubeconfig)
    core = k8s.CoreV1Api(admin_api)
    adm = k8s.AdmissionregistrationV1Api(admin_api)
    port = free_port()
    mwc = f"dynamiccl-test-{namespace}"
    adm.create_mutating_webhook_configuration(
        builders.pod_webhook(mwc, port=port, namespace=namespace),  # type: ignore[arg-type]  # the client takes dict bodies
    )
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamiccl.cli",
            "operator",
            "--no-handlers",
            "--kubeconfig",
            kubeconfig,
            "--namespace",
            namespace,
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(port),
            "--metrics-port",
            "0",
            "--webhook-config",
            mwc,
            "--extra-san",
            "127.0.0.1",
            "--image",
            "dynamiccl:test",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_healthy(port, proc)
        core.create_namespaced_config_map(
            namespace,
            {  # type: ignore[arg-type]  # the client takes dict bodies
                "metadata": {
                    "name": "llm-dynamiccl",
                    "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_COMPONENT: "job-config"},
                    "annotations": {c.ANNOTATION_JOB_KIND: "PyTorchJob"},
                },
                "data": {"env.json": '{"NCCL_NTHREADS": "256"}'},
            },
        )
        time.sleep(1.0)  # let the watch cache see it (a miss would GET it anyway)
        tuned = core.create_namespaced_pod(namespace, _pod("tuned", "llm"))  # type: ignore[arg-type]  # the client takes dict bodies
        spec = _spec(tuned)
        inits = [i.name for i in spec.init_containers or []]
        assert "dynamiccl-sidecar" in inits
        assert spec.init_containers is not None
        sidecar = next(i for i in spec.init_containers if i.name == "dynamiccl-sidecar")
        assert sidecar.restart_policy == "Always"
        assert sidecar.security_context is not None
        assert sidecar.security_context.read_only_root_filesystem is True
        assert spec.containers[0].env is not None
        envs = {e.name: e.value for e in spec.containers[0].env}
        assert envs["NCCL_ALGO"] == "Ring"  # the user's value is kept
        assert envs["NCCL_NTHREADS"] == "256"
        tuner = envs[c.ENV_NCCL_TUNER_PLUGIN]
        assert tuner is not None
        assert tuner.endswith(c.PLUGIN_LIBRARY)
        assert spec.volumes is not None
        assert {v.name for v in spec.volumes} >= {
            "dynamiccl-config",
            "dynamiccl-shm",
            "dynamiccl-plugin",
        }
        assert tuned.metadata is not None
        assert tuned.metadata.annotations is not None
        assert '"NCCL_ALGO": "Ring"' in tuned.metadata.annotations[c.ANNOTATION_USER_NCCL_ENV]
        other = core.create_namespaced_pod(namespace, _pod("other", "not-tuned"))  # type: ignore[arg-type]  # the client takes dict bodies
        assert not _spec(other).init_containers
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    try:
        # the webhook's address refuses connections (the process is gone, no listener was
        # left behind), so the apiserver's call fails at once instead of waiting out the
        # timeout; asserted as that fact, not as a wall-clock bound, which a loaded machine
        # could miss on a correct product (and which no failurePolicy Ignore outcome, hung
        # or refused, could exceed on an idle one)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        start = time.perf_counter()
        down = core.create_namespaced_pod(namespace, _pod("down", "llm"))  # type: ignore[arg-type]  # the client takes dict bodies
        elapsed = time.perf_counter() - start
        assert not _spec(down).init_containers  # failurePolicy Ignore: created untuned
        print(f"pod created with the webhook down in {elapsed:.2f} s")
    finally:
        adm.delete_mutating_webhook_configuration(mwc)

"""Webhook certificate rotation and hot reload, against a REAL kube-apiserver.

``dynamiccl operator --no-handlers --cert-check-interval 1`` runs as a local
process behind a MutatingWebhookConfiguration (``clientConfig.url``). Time
passing is simulated by writing a certificate 25 days from expiry into the
operator's Secret (the operator renews 30 days ahead). Checked, without
restarting the process: a new certificate is issued and written, the caBundle
trusts it (and still the previous CA), the webhook serves it on new TLS
connections, and the apiserver keeps calling the webhook successfully (a pod
is mutated after the rotation). A caBundle that drifted (e.g. reset by a
``helm upgrade``) is put back.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography import x509
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.operator.webhook import certs
from dynamiccl.testing import builders
from dynamiccl.testing.ports import free_port

SECRET = "dynamiccl-webhook-tls"


def _wait(what: str, fn: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (ApiException, OSError, ssl.SSLError) as exc:
            last = exc
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what} (last: {last!r})")


def _served_serial(port: int, ca_pem: bytes) -> int:
    """Serial of the certificate a NEW TLS connection gets, verified with ``ca_pem``."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


@pytest.fixture
def env(
    cluster_kubeconfig: Path, admin_api: k8s.ApiClient, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    core, adm = k8s.CoreV1Api(admin_api), k8s.AdmissionregistrationV1Api(admin_api)
    ns = f"dyn-rot-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    port = free_port()
    mwc = f"dynamiccl-rotation-{ns}"
    adm.create_mutating_webhook_configuration(
        builders.pod_webhook(mwc, port=port, namespace=ns, reinvocation_policy=None),  # type: ignore[arg-type]  # the client takes dict bodies
    )
    log = (tmp_path / "operator.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamiccl.cli",
            "operator",
            "--no-handlers",
            f"--kubeconfig={cluster_kubeconfig}",
            f"--namespace={ns}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={port}",
            "--metrics-port=0",
            f"--webhook-config={mwc}",
            "--extra-san=127.0.0.1",
            "--cert-check-interval=1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield {"core": core, "adm": adm, "ns": ns, "port": port, "mwc": mwc, "proc": proc}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        adm.delete_mutating_webhook_configuration(mwc)
        core.delete_namespace(ns)


def _bundle(core: k8s.CoreV1Api, ns: str) -> certs.Bundle:
    data = core.read_namespaced_secret(SECRET, ns).data
    assert data is not None
    # the client keeps a Secret's data as the apiserver's base64 strings
    bundle = certs.Bundle.from_secret_data(cast(dict[str, str], data))
    assert bundle is not None
    return bundle


def _ca_bundle(adm: k8s.AdmissionregistrationV1Api, mwc: str) -> bytes:
    hooks = adm.read_mutating_webhook_configuration(mwc).webhooks
    assert hooks
    hook = hooks[0]
    return base64.b64decode(hook.client_config.ca_bundle or "")


def _tuned_pod_is_mutated(core: k8s.CoreV1Api, ns: str, name: str) -> bool:
    pod = core.create_namespaced_pod(
        ns,
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "metadata": {
                "name": f"{name}-{uuid.uuid4().hex[:6]}",
                "labels": {c.LABEL_KUBEFLOW_JOB_NAME: "llm"},
            },
            "spec": {"containers": [{"name": "pytorch", "image": "example.invalid/t:1"}]},
        },
    )
    assert pod.spec is not None
    return "dynamiccl-sidecar" in [i.name for i in pod.spec.init_containers or []]


def test_expiring_certificate_is_rotated_and_hot_reloaded(env: dict[str, Any]) -> None:
    core, adm, ns, port = env["core"], env["adm"], env["ns"], env["port"]
    first = _wait("the operator's TLS secret", lambda: _bundle(core, ns), 90)
    _wait(
        "the webhook serving the first certificate",
        lambda: _served_serial(port, first.ca_crt) == _serial(first.tls_crt),
        90,
    )
    core.create_namespaced_config_map(
        ns,
        {
            "metadata": {
                "name": "llm-dynamiccl",
                "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_COMPONENT: "job-config"},
                "annotations": {c.ANNOTATION_JOB_KIND: "PyTorchJob"},
            },
            "data": {"env.json": "{}"},
        },
    )
    assert _wait("a mutated pod before the rotation", lambda: _tuned_pod_is_mutated(core, ns, "a"))

    # 25 days before expiry: inside the 30-day renewal window.
    names = [*certs.service_names("dynamiccl-webhook", ns), "127.0.0.1"]
    aged = certs.issue(names, now=datetime.now(UTC) - timedelta(days=certs.CERT_DAYS - 25))
    core.patch_namespaced_secret(SECRET, ns, {"data": aged.secret_data()})

    def rotated() -> certs.Bundle | None:
        b = _bundle(core, ns)
        return b if b.tls_crt not in (aged.tls_crt, first.tls_crt) else None

    new = _wait("a renewed certificate in the Secret", rotated, 30)
    assert certs.needs_rotation(new, names) is None
    ca_serials = [x.serial_number for x in x509.load_pem_x509_certificates(new.ca_crt)]
    assert ca_serials[1] == _serial(aged.ca_crt)  # the previous CA is still trusted
    _wait("the caBundle to trust the new CA", lambda: _ca_bundle(adm, env["mwc"]) == new.ca_crt)
    _wait(
        "new TLS connections to get the new certificate",
        lambda: _served_serial(port, new.ca_crt) == _serial(new.tls_crt),
        30,
    )
    assert env["proc"].poll() is None  # same process: reloaded, not restarted
    assert _wait("a mutated pod after the rotation", lambda: _tuned_pod_is_mutated(core, ns, "b"))

    # A caBundle reset behind our back is put back by the next check.
    adm.patch_mutating_webhook_configuration(
        env["mwc"],
        {"webhooks": [{"name": "pods.dynamiccl.io", "clientConfig": {"caBundle": ""}}]},
    )
    _wait("the caBundle restored", lambda: _ca_bundle(adm, env["mwc"]) == new.ca_crt, 30)

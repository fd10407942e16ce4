"""The chart's RBAC and admission policies applied to a REAL apiserver, for attack tests.

`install(api, release)` renders the chart (helm template), applies its
ServiceAccounts, (Cluster)Roles, bindings and ValidatingAdmissionPolicies (+
bindings, narrowed to this test's namespaces so that other tests running on the
same cluster are not affected) and returns what the tests need: a client acting
with a ServiceAccount's token (pod-bound when a pod is given), names, teardown.
Not a test module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.chart_releases import drop_other_releases_policies

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "dynamiccl"
CACHE = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))
KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)
TEST_LABEL = "dynamiccl.io/boundary-test"


def tool(name: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in sorted(CACHE.glob(f"bin/{name}-*/{name}")) if os.access(p, os.X_OK)),
        None,
    )
    assert found is not None, f"{name} not built (make tools)"
    return found


def render(release: str, namespace: str, sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The chart's objects of KINDS (``sets``: helm ``--set`` values)."""
    values = [arg for s in sets for arg in ("--set", s)]
    out = subprocess.run(
        [tool("helm"), "template", release, str(CHART), "--namespace", namespace, *values],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d and d.get("kind") in KINDS]


@dataclass
class Release:
    api: k8s.ApiClient
    name: str  # the chart's fullname prefix
    namespace: str
    kubeconfig: Path
    suffix: str
    cleanups: list[Callable[[], Any]] = field(default_factory=list)

    def sa_user(self, sa: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}-{sa}"

    def token(self, sa: str, namespace: str | None = None, pod: k8s.V1Pod | None = None) -> str:
        """A TokenRequest token of a ServiceAccount, bound to `pod` when given."""
        spec: dict[str, Any] = {"expirationSeconds": 600}
        if pod is not None:
            assert pod.metadata is not None
            spec["boundObjectRef"] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            }
        core: Any = k8s.CoreV1Api(self.api)  # dict bodies: the typed stubs want models
        req = core.create_namespaced_service_account_token(
            sa, namespace or self.namespace, {"spec": spec}
        )
        assert req.status is not None
        return str(req.status.token)

    def as_token(self, token: str) -> k8s.ApiClient:
        admin = self.api.configuration
        cfg = k8s.Configuration()
        cfg.host = admin.host
        cfg.ssl_ca_cert = admin.ssl_ca_cert
        cfg.api_key = {"authorization": f"Bearer {token}"}
        api = k8s.ApiClient(cfg)
        self.cleanups.append(api.close)
        return api

    def can_i_list(self, sa: str) -> str:
        res = subprocess.run(
            [
                tool("kubectl"),
                "--kubeconfig",
                str(self.kubeconfig),
                "auth",
                "can-i",
                "--list",
                f"--as={self.sa_user(sa)}",
                "-n",
                self.namespace,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return res.stdout

    def teardown(self) -> None:
        for fn in reversed(self.cleanups):
            try:
                fn()
            except ApiException as exc:
                if exc.status != 404:
                    raise


def _apply(api: k8s.ApiClient, doc: dict[str, Any]) -> Callable[[], Any]:
    kind, meta = doc["kind"], doc["metadata"]
    ns = meta.get("namespace")
    # dict bodies: the typed stubs want models
    core: Any = k8s.CoreV1Api(api)
    rbac: Any = k8s.RbacAuthorizationV1Api(api)
    adm: Any = k8s.AdmissionregistrationV1Api(api)
    actions: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "ServiceAccount": (
            lambda: core.create_namespaced_service_account(ns, doc),
            lambda: core.delete_namespaced_service_account(meta["name"], ns),
        ),
        "ClusterRole": (
            lambda: rbac.create_cluster_role(doc),
            lambda: rbac.delete_cluster_role(meta["name"]),
        ),
        "ClusterRoleBinding": (
            lambda: rbac.create_cluster_role_binding(doc),
            lambda: rbac.delete_cluster_role_binding(meta["name"]),
        ),
        "Role": (
            lambda: rbac.create_namespaced_role(ns, doc),
            lambda: rbac.delete_namespaced_role(meta["name"], ns),
        ),
        "RoleBinding": (
            lambda: rbac.create_namespaced_role_binding(ns, doc),
            lambda: rbac.delete_namespaced_role_binding(meta["name"], ns),
        ),
        "ValidatingAdmissionPolicy": (
            lambda: adm.create_validating_admission_policy(doc),
            lambda: adm.delete_validating_admission_policy(meta["name"]),
        ),
        "ValidatingAdmissionPolicyBinding": (
            lambda: adm.create_validating_admission_policy_binding(doc),
            lambda: adm.delete_validating_admission_policy_binding(meta["name"]),
        ),
    }
    create, delete = actions[kind]
    create()
    return delete


def install(api: k8s.ApiClient, kubeconfig: Path, suffix: str, sets: Sequence[str] = ()) -> Release:
    """Render and apply the chart's RBAC and policies as release `b<suffix>` in its own
    namespace; every policy binding is narrowed to namespaces labelled TEST_LABEL=suffix
    (cluster-scoped objects such as Nodes still match: a binding's namespaceSelector does
    not apply to them)."""
    ns, release = f"b19-{suffix}", f"b{suffix}"
    drop_other_releases_policies(api, release)
    core: Any = k8s.CoreV1Api(api)  # dict bodies: the typed stubs want models
    core.create_namespace({"metadata": {"name": ns, "labels": {TEST_LABEL: suffix}}})
    rel = Release(api, f"{release}-dynamiccl", ns, kubeconfig, suffix)
    rel.cleanups.append(lambda: core.delete_namespace(ns))
    for doc in render(release, ns, sets):
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            doc["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {TEST_LABEL: suffix}}
            }
        rel.cleanups.append(_apply(api, doc))
    time.sleep(2)  # admission policies are enforced once their informers saw them
    return rel


def status_of(call: Callable[[], Any]) -> int:
    """The HTTP status a call is answered with (200 when it returns)."""
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200

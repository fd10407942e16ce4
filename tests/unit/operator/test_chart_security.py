"""The chart's trust boundaries (issue 19): secrets, ServiceAccounts, mounts, RBAC."""

from __future__ import annotations

import json
import subprocess

import pytest

from dynamiccl.api.store_secrets import carries_secret
from tests.unit.operator.test_chart import CHART, _helm, _kind, _template


def _ingest_container() -> dict[str, object]:
    [dep] = [
        d for d in _kind(_template(), "Deployment") if d["metadata"]["name"].endswith("-ingest")
    ]
    [ctr] = dep["spec"]["template"]["spec"]["containers"]
    return ctr  # type: ignore[no-any-return]


def test_the_store_url_is_never_on_a_command_line() -> None:
    """Item 8: $(VAR) in args is expanded into argv, readable by every process in /proc."""
    ctr = _ingest_container()
    assert not [a for a in ctr["args"] if "STORE_URL" in a or a.startswith("--store")]  # type: ignore[attr-defined]
    secret = _template("store.urlSecret=pg", "store.persistence.enabled=true")
    text = json.dumps(secret)
    assert '"secretKeyRef": {"name": "pg", "key": "url"}' in text


def test_a_store_url_with_a_password_is_refused() -> None:
    args = [_helm(), "template", "t", str(CHART), "--set", "store.url=postgresql://u:pw@db/x"]
    res = subprocess.run(args, capture_output=True, text=True, check=False)
    assert res.returncode != 0
    assert "store.urlSecret" in res.stderr
    assert "pw@" not in res.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@db:5432/x?password=S3cretPW",  # issue 32 B: rendered as a plain env
        "postgresql://u@db:5432/x?sslmode=require&sslpassword=S3cretPW",
        "postgresql://u@db:5432/x?PASSWORD=S3cretPW",
        "postgresql://u@db:5432/x?pass%77ord=S3cretPW",
        "postgresql://u@db:5432/x?passfile=/etc/S3cretPW",
        "postgresql://u@db:5432/x?oauth_client_secret=S3cretPW",
        "postgresql://u:p@ss/w0rd@db/x",
    ],
)
def test_a_store_url_with_any_secret_is_refused(url: str) -> None:
    """The chart refuses what dynamiccl/api/store_secrets.py finds (and percent-encoded
    parameter names, which could spell one)."""
    assert carries_secret(url)
    res = subprocess.run(
        [_helm(), "template", "t", str(CHART), "--set-string", f"store.url={url}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode != 0
    assert "store.urlSecret" in res.stderr
    assert "S3cretPW" not in res.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@db:5432/x?sslmode=require&application_name=trainer",
        "postgresql://db.example/dynamiccl",
    ],
)
def test_a_store_url_without_secrets_is_rendered_as_an_env_value(url: str) -> None:
    assert not carries_secret(url)
    docs = _template(f"store.url={url}")
    [dep] = [d for d in _kind(docs, "Deployment") if d["metadata"]["name"].endswith("-ingest")]
    [ctr] = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "DYNAMICCL_STORE_URL", "value": url} in ctr["env"]


def test_the_ingest_runs_under_its_own_account_and_mounts_only_what_it_serves() -> None:
    """Item 3: not the operator's ServiceAccount; not the CA's private key."""
    docs = _template()
    [dep] = [d for d in _kind(docs, "Deployment") if d["metadata"]["name"].endswith("-ingest")]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "t-dynamiccl-ingest"
    [tls] = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["items"] == [
        {"key": "tls.crt", "path": "tls.crt"},
        {"key": "tls.key", "path": "tls.key"},
    ]
    roles = {d["metadata"]["name"]: d for d in _kind(docs, "ClusterRole")}
    operator_rules = json.dumps(roles["t-dynamiccl-operator"]["rules"])
    assert "tokenreviews" not in operator_rules  # the ingest's, not the operator's
    ingest = roles["t-dynamiccl-ingest"]["rules"]
    verbs = {v for r in ingest for v in r["verbs"]}
    assert verbs <= {"get", "create", "list", "patch"}
    assert not [r for r in ingest if "configmaps" in r["resources"] or "secrets" in r["resources"]]


def test_the_admission_policies_are_rendered() -> None:
    docs = _template()
    names = {d["metadata"]["name"] for d in _kind(docs, "ValidatingAdmissionPolicy")}
    assert names == {
        "t-dynamiccl-node-agent",
        "t-dynamiccl-ingest-jobs",
        "t-dynamiccl-coordination",
        "t-dynamiccl-job-config",
    }
    bindings = _kind(docs, "ValidatingAdmissionPolicyBinding")
    assert {b["spec"]["policyName"] for b in bindings} == names
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)


def test_the_node_agent_runs_under_a_uid_of_its_own_with_the_narrowest_mounts() -> None:
    """Item 6: no other component's uid (the sidecar's is mutate.NON_ROOT_UID), no /dev."""
    from dynamiccl.operator.webhook.mutate import NON_ROOT_UID  # noqa: PLC0415

    docs = _template()
    [ds] = _kind(docs, "DaemonSet")
    [ct] = ds["spec"]["template"]["spec"]["containers"]
    uid = ct["securityContext"]["runAsUser"]
    others = [
        c["securityContext"]["runAsUser"]
        for d in _kind(docs, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert uid not in {*others, NON_ROOT_UID}
    assert ct["securityContext"]["runAsGroup"] == uid
    assert ct["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    host = {m["mountPath"]: m for m in ct["volumeMounts"] if m["mountPath"].startswith("/host")}
    assert set(host) == {"/host/sys", "/host/proc"}
    assert all(m["readOnly"] for m in host.values())


def test_rate_limits_and_retention_come_from_values() -> None:
    """Item 7: the ingest's flags, parsed by its own CLI."""
    from dynamiccl.operator.ingest.cli import parse  # noqa: PLC0415

    ctr = _ingest_container()
    args = [a for a in ctr["args"] if a.startswith(("--rate", "--retention"))]  # type: ignore[attr-defined]
    assert len(args) == 6
    s = parse(["--store", "x.db", "--insecure-http", *args])
    assert s.rate_pod is not None
    assert (s.rate_pod.rate, s.rate_pod.burst) == (500, 4096)
    assert s.rate_job is not None
    assert s.retention_max_age_s == 180 * 86_400
    assert s.retention_max_rows == 20_000_000

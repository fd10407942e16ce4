"""The Helm chart: lint --strict, template renders, and the promises it makes hold."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "dynamiccl"
CACHE = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))


def _helm() -> str:
    found = shutil.which("helm") or next(
        (str(p) for p in sorted(CACHE.glob("bin/helm-*/helm")) if os.access(p, os.X_OK)), None
    )
    if found is None:
        pytest.skip("helm not built yet (make tools builds it into $DYNAMICCL_CACHE/bin)")
    return found


def _template(*sets: str) -> list[dict[str, Any]]:
    args = [_helm(), "template", "t", str(CHART), "--namespace", "dynamiccl-system"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_lint_strict() -> None:
    res = subprocess.run(
        [_helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_webhook_never_blocks_pods() -> None:
    [mwc] = _kind(_template(), "MutatingWebhookConfiguration")
    assert len(mwc["webhooks"]) == 2
    for hook in mwc["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"
        assert hook["timeoutSeconds"] <= 3
        assert hook["reinvocationPolicy"] == "IfNeeded"
        assert hook["sideEffects"] == "None"
        assert hook["rules"][0]["operations"] == ["CREATE"]
        excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert {"kube-system", "dynamiccl-system"} <= set(excluded)
        assert hook["objectSelector"]["matchExpressions"]
        assert hook["clientConfig"]["service"]["path"] == "/mutate"


def test_webhook_url_mode_for_out_of_cluster_operator() -> None:
    [mwc] = _kind(
        _template("webhook.url=https://127.0.0.1:9443/mutate"), "MutatingWebhookConfiguration"
    )
    assert mwc["webhooks"][0]["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate"}


def test_operator_is_ha_and_hardened() -> None:
    docs = _template()
    op = next(d for d in _kind(docs, "Deployment") if d["metadata"]["name"].endswith("operator"))
    assert op["spec"]["replicas"] == 2
    ct = op["spec"]["template"]["spec"]["containers"][0]
    assert any(a.startswith("--peering=") for a in ct["args"])
    sc = ct["securityContext"]
    assert sc["runAsNonRoot"]
    assert sc["readOnlyRootFilesystem"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert _kind(docs, "ClusterKopfPeering")
    single = _template("operator.replicas=1")
    op1 = next(d for d in _kind(single, "Deployment") if d["metadata"]["name"].endswith("operator"))
    assert not any(
        a.startswith("--peering") for a in op1["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_only_the_operator_reads_models_from_the_ingest() -> None:
    docs = _template()
    deps = {d["metadata"]["name"]: d for d in _kind(docs, "Deployment")}
    ingest, op = deps["t-dynamiccl-ingest"], deps["t-dynamiccl-operator"]
    readers = [
        a
        for a in ingest["spec"]["template"]["spec"]["containers"][0]["args"]
        if "model-reader" in a
    ]
    sa = op["spec"]["template"]["spec"]["serviceAccountName"]
    assert readers == [f"--model-reader=system:serviceaccount:dynamiccl-system:{sa}"]
    args = op["spec"]["template"]["spec"]["containers"][0]["args"]
    token_file = next(a.split("=", 1)[1] for a in args if a.startswith("--model-token-file="))
    vol = next(v for v in op["spec"]["template"]["spec"]["volumes"] if v["name"] == "ingest-token")
    src = vol["projected"]["sources"][0]["serviceAccountToken"]
    assert src["audience"] == "dynamiccl-ingest"
    mount = next(
        m
        for m in op["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        if m["name"] == "ingest-token"
    )
    assert token_file == f"{mount['mountPath']}/{src['path']}"


def _ingest(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in _kind(docs, "Deployment") if d["metadata"]["name"].endswith("ingest"))


def _flags(dep: dict[str, Any], flag: str) -> list[str]:
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]


def test_the_ingest_runs_the_learning_loop_with_objects_the_chart_creates() -> None:
    docs = _template()
    ingest = _ingest(docs)
    pod = ingest["spec"]["template"]
    assert _flags(ingest, "--loop-namespace") == ["dynamiccl-system"]
    # the Dockerfile's trainer target, tagged like the runtime image with "-train"
    assert _flags(ingest, "--loop-image") == [pod["spec"]["containers"][0]["image"] + "-train"]
    # the Job mounts the PVC the ingest's store lives on, at the same path
    (pvc,) = _kind(docs, "PersistentVolumeClaim")
    assert _flags(ingest, "--loop-pvc") == [pvc["metadata"]["name"]]
    store = next(v for v in pod["spec"]["volumes"] if v["name"] == "store")
    assert store["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "store")
    assert mount["mountPath"] == "/var/lib/dynamiccl"  # the ingest's --loop-mount-path default
    # the Job's ServiceAccount exists and carries no token
    (train_sa,) = _flags(ingest, "--loop-service-account")
    sas = {d["metadata"]["name"]: d for d in _kind(docs, "ServiceAccount")}
    assert sas[train_sa]["automountServiceAccountToken"] is False
    # SQLite on a ReadWriteOnce volume: the Job is placed with the ingest pod, whose labels match
    labels = dict(kv.split("=", 1) for kv in _flags(ingest, "--loop-colocate-label"))
    assert labels
    assert labels.items() <= pod["metadata"]["labels"].items()
    # the ingest's ServiceAccount may create the Job and patch TuningRun status
    sa = pod["spec"]["serviceAccountName"]
    rules = [
        r
        for d in _kind(docs, "Role") + _kind(docs, "ClusterRole")
        if d["metadata"]["name"] == sa
        for r in d["rules"]
    ]
    assert any("jobs" in r["resources"] and "create" in r["verbs"] for r in rules)
    assert any("tuningruns/status" in r["resources"] and "patch" in r["verbs"] for r in rules)


def test_learning_loop_options() -> None:
    off = _template("learning.enabled=false")
    assert not _flags(_ingest(off), "--loop-namespace")
    assert not any(d["metadata"]["name"].endswith("-train") for d in _kind(off, "ServiceAccount"))
    ingest = _ingest(_template("learning.image=reg.example/trainer:1", "learning.interval=5"))
    assert _flags(ingest, "--loop-image") == ["reg.example/trainer:1"]
    assert _flags(ingest, "--loop-interval") == ["5"]
    # PostgreSQL from a Secret: the Job reads the URL from the same Secret; no colocation
    pg = _ingest(_template("store.urlSecret=dynamiccl-pg"))
    assert _flags(pg, "--loop-store-secret") == ["dynamiccl-pg"]
    assert not _flags(pg, "--loop-colocate-label")
    res = subprocess.run(
        [_helm(), "template", "t", str(CHART), "--set", "store.persistence.enabled=false"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode != 0
    assert "learning.enabled needs store.persistence.enabled" in res.stderr


def _job_pod(ingest: dict[str, Any]) -> dict[str, Any]:
    """The retraining Job's pod as the ingest's loop builds it from the chart's arguments."""
    from dynamiccl.operator.ingest.cli import parse  # noqa: PLC0415
    from dynamiccl.operator.learning.retrain import RetrainSpec, build_retrain_job  # noqa: PLC0415

    args = ingest["spec"]["template"]["spec"]["containers"][0]["args"]
    cfg = parse([*args, "--store", "sqlite:////var/lib/dynamiccl/e.db"]).loop
    assert cfg is not None
    spec = RetrainSpec(
        policy_name="p", policy_uid="u", namespace=cfg.namespace, image=cfg.image,
        store_url=cfg.store_url, new_version="p-1", parent_version="default",
        pvc_name=cfg.pvc_name, colocate_with=cfg.colocate_with,
        node_selector=cfg.node_selector, tolerations=cfg.tolerations,
        cpu=cfg.cpu, memory=cfg.memory,
    )  # fmt: skip
    pod: dict[str, Any] = build_retrain_job(spec)["spec"]["template"]["spec"]
    return pod


def test_the_retraining_job_follows_the_ingest_onto_a_tainted_node() -> None:
    taint = {
        "key": "example.com/dedicated",
        "operator": "Equal",
        "value": "ml",
        "effect": "NoSchedule",
    }
    where = (
        "ingest.nodeSelector.pool=ml",
        f"ingest.tolerations[0].key={taint['key']}",
        "ingest.tolerations[0].operator=Equal",
        "ingest.tolerations[0].value=ml",
        "ingest.tolerations[0].effect=NoSchedule",
    )
    ingest = _ingest(_template(*where))
    ingest_pod = ingest["spec"]["template"]["spec"]
    job_pod = _job_pod(ingest)
    # SQLite on a ReadWriteOnce volume: the Job must land on the ingest's node, so it
    # carries the ingest's node selector and tolerations (without them the scheduler
    # never places it there: the pod affinity alone cannot pass a taint)
    assert job_pod["nodeSelector"] == ingest_pod["nodeSelector"] == {"pool": "ml"}
    assert job_pod["tolerations"] == ingest_pod["tolerations"] == [taint]
    assert job_pod["affinity"]["podAffinity"]
    requests = job_pod["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "2", "memory": "4Gi"}
    # learning.* set: those win, and the size is configurable
    own = _job_pod(
        _ingest(
            _template(
                *where,
                "learning.nodeSelector.pool=train",
                "learning.tolerations[0].operator=Exists",
                "learning.cpu=500m",
                "learning.memory=1Gi",
            )
        )
    )
    assert own["nodeSelector"] == {"pool": "train"}
    assert own["tolerations"] == [{"operator": "Exists"}]
    assert own["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
    assert own["containers"][0]["resources"]["limits"] == {"memory": "1Gi"}
    # nothing set anywhere: no placement fields at all
    bare = _job_pod(_ingest(_template()))
    assert "nodeSelector" not in bare
    assert "tolerations" not in bare


def test_node_agent_mounts_host_read_only() -> None:
    [ds] = _kind(_template(), "DaemonSet")
    ct = ds["spec"]["template"]["spec"]["containers"][0]
    assert ct["args"][0] == "node-agent"
    assert all(m.get("readOnly") for m in ct["volumeMounts"] if m["mountPath"].startswith("/host"))


def test_optional_parts() -> None:
    docs = _template(
        "certManager.enabled=true",
        "metrics.serviceMonitor.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
        "defaultPolicy.enabled=true",
    )
    kinds = {d["kind"] for d in docs}
    assert {"Certificate", "Issuer", "ServiceMonitor", "NCCLTuningPolicy"} <= kinds
    [mwc] = _kind(docs, "MutatingWebhookConfiguration")
    assert "cert-manager.io/inject-ca-from" in mwc["metadata"]["annotations"]
    assert _kind(_template(), "PersistentVolumeClaim")


def test_schema_rejects_bad_values() -> None:
    res = subprocess.run(
        [_helm(), "template", "t", str(CHART), "--set", "webhook.timeoutSeconds=10"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode != 0
    assert "timeoutSeconds" in res.stderr


def test_every_rbac_rule_is_commented() -> None:
    text = (CHART / "templates" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(text):
        if re.match(r"^\s*- apiGroups:", line):
            assert text[i - 1].strip().startswith("#"), f"rbac.yaml:{i + 1}: rule without a comment"


def test_every_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented: dict[int, bool] = {}  # indent → is the current key at that indent documented
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        prev = lines[i - 1].strip() if i else ""
        parent_doc = any(v for k, v in documented.items() if k < indent)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        section = line.rstrip().endswith(":") and nxt.startswith(m.group(1) + "  ")
        ok = prev.startswith("#") or parent_doc
        documented = {k: v for k, v in documented.items() if k < indent}
        documented[indent] = prev.startswith("#")
        assert ok or section, f"values.yaml:{i + 1}: {line.strip()} has no comment"

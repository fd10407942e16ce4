"""Retraining trigger and Job manifest (pure)."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from dynamiccl.operator.learning.retrain import (
    RetrainSpec,
    StoreSecretRequired,
    build_retrain_job,
    model_version_name,
    retrain_due,
    train_args,
)

DAY = 86_400.0


def due(**over: object) -> bool:
    kw: dict[str, object] = {
        "now_unix_s": 10 * DAY + 3600,
        "schedule": None,
        "min_new_experience": 1000,
        "new_rows": 10,
        "last_started_unix_s": 9 * DAY,
        "policy_created_unix_s": 0.0,
        "running": False,
    }
    kw.update(over)
    return retrain_due(**kw).due  # type: ignore[arg-type]


def test_trigger_rules() -> None:
    assert not due()  # 10 rows < 1000, no schedule
    assert due(new_rows=1000)
    assert not due(new_rows=5000, running=True)
    assert not due(new_rows=0, schedule="@hourly")
    assert due(schedule="@daily")  # fired since day 9
    assert not due(schedule="@daily", last_started_unix_s=10 * DAY + 60)
    assert due(schedule="@daily", last_started_unix_s=None)  # since policy creation
    assert not due(min_new_experience=0, new_rows=10**6)  # count rule disabled
    d = retrain_due(
        now_unix_s=0,
        schedule=None,
        min_new_experience=5,
        new_rows=7,
        last_started_unix_s=None,
        policy_created_unix_s=0,
        running=False,
    )
    assert d.due
    assert "7 new experience rows" in d.reason


def test_model_version_name_fits_the_crd_pattern() -> None:
    v = model_version_name("Team_A/Policy" * 10, dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert v.endswith("-20250102030405")
    assert len(v) <= 63
    assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", v)


def spec(**over: object) -> RetrainSpec:
    kw: dict[str, object] = {
        "policy_name": "default",
        "policy_uid": "uid-1",
        "namespace": "dynamiccl-system",
        "image": "ghcr.io/x/dynamiccl:0.1.0",
        "store_url": "sqlite:////var/lib/dynamiccl/experience.db",
        "new_version": "default-20250102030405",
        "parent_version": "default",
        "pvc_name": "dynamiccl-experience",
    }
    kw.update(over)
    return RetrainSpec(**kw)  # type: ignore[arg-type]


def test_job_manifest() -> None:
    job = build_retrain_job(spec())
    meta, pod = job["metadata"], job["spec"]["template"]["spec"]
    assert meta["name"] == "dynamiccl-train-default-20250102030405"
    assert len(meta["name"]) <= 63
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "NCCLTuningPolicy",
        "default",
        "uid-1",
        True,
    )
    (ctr,) = pod["containers"]
    assert ctr["command"][:4] == ["dynamiccl", "train", "--from-store-env", "DYNAMICCL_STORE_URL"]
    assert {"name": "DYNAMICCL_STORE_URL", "value": spec().store_url} in ctr["env"]
    assert "--out" in ctr["command"]
    assert ctr["command"][ctr["command"].index("--out") + 1] == (
        "/var/lib/dynamiccl/models/default-20250102030405"
    )
    assert ctr["command"][-1] == "--json"
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["dynamiccl-experience"]
    assert job["spec"]["template"]["metadata"]["labels"]["dynamiccl.io/model-version"] == (
        "default-20250102030405"
    )


def test_a_store_url_from_a_secret_never_appears_in_the_job() -> None:
    secret_url = "postgresql://u:s3cret@db/dynamiccl"
    job = build_retrain_job(spec(store_url=secret_url, store_url_secret="dynamiccl-store"))
    assert "s3cret" not in json.dumps(job)
    (ctr,) = job["spec"]["template"]["spec"]["containers"]
    # never $(VAR) in the command: the kubelet would expand it into the process's argv,
    # which every process of the node can read in /proc (issue 19, item 8)
    assert ctr["command"][:4] == ["dynamiccl", "train", "--from-store-env", "DYNAMICCL_STORE_URL"]
    (env,) = [e for e in ctr["env"] if e["name"] == "DYNAMICCL_STORE_URL"]
    assert env == {
        "name": "DYNAMICCL_STORE_URL",
        "valueFrom": {"secretKeyRef": {"name": "dynamiccl-store", "key": "url"}},
    }


def test_a_store_url_with_a_password_but_no_secret_is_refused() -> None:
    with pytest.raises(StoreSecretRequired, match="Secret"):
        build_retrain_job(spec(store_url="postgresql://u:s3cret@db/dynamiccl"))
    # no password: the URL may travel as a plain env value (still never in argv)
    job = build_retrain_job(spec(store_url="postgresql://db/dynamiccl"))
    (ctr,) = job["spec"]["template"]["spec"]["containers"]
    assert "postgresql://db/dynamiccl" not in ctr["command"]


def test_long_names_are_shortened_with_a_digest() -> None:
    a = build_retrain_job(spec(new_version="x" * 60))["metadata"]["name"]
    b = build_retrain_job(spec(new_version="x" * 59 + "y"))["metadata"]["name"]
    assert len(a) <= 63
    assert a != b


def test_optional_args() -> None:
    args = train_args(
        spec(
            parent_version=None,
            config_path="/etc/dynamiccl/train.yaml",
            extra_args=("--epochs", "3"),
        )
    )
    assert "--parent" not in args
    assert args[args.index("--config") + 1] == "/etc/dynamiccl/train.yaml"
    assert args[-3:] == ["--epochs", "3", "--json"]


def test_sqlite_on_rwo_volume_runs_next_to_the_operator() -> None:
    sel = {"app.kubernetes.io/name": "dynamiccl-operator"}
    pod = build_retrain_job(spec(colocate_with=sel))["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["labelSelector"]["matchLabels"] == sel
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert "affinity" not in build_retrain_job(spec())["spec"]["template"]["spec"]


def test_placement_on_tainted_nodes() -> None:
    tol = {"key": "dynamiccl.io/real-node", "operator": "Exists"}
    pod = build_retrain_job(
        spec(
            node_selector={"dynamiccl.io/real-node": "true"},
            tolerations=(tol,),
            colocate_with={"app": "ingest"},
            cpu="500m",
            memory="1Gi",
        )
    )["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"dynamiccl.io/real-node": "true"}
    assert pod["tolerations"] == [tol]
    assert pod["affinity"]["podAffinity"]
    (ctr,) = pod["containers"]
    assert ctr["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"memory": "1Gi"},
    }
    omp = next(e for e in ctr["env"] if e["name"] == "OMP_NUM_THREADS")
    assert omp["value"] == "2"  # a fractional request: torch keeps 2 threads

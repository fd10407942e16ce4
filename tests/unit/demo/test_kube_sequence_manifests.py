"""The sequence's objects (`make demo-cluster`): the chart's ingest and operator as local
processes, the learning policy, the jobs; rendered from the real chart with `helm template`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dynamiccl import constants as c
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.kube_manifests import (
    CHART,
    RELEASE,
    SEQUENCE_GPU_PRODUCT,
    SYSTEM_NS,
    chart_values,
    ingest_args,
    learning_policy,
    operator_args,
    sequence_job,
)

CACHE = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))


def _manifest(store_url: str) -> str:
    helm = shutil.which("helm") or next(
        (str(p) for p in sorted(CACHE.glob("bin/helm-*/helm")) if os.access(p, os.X_OK)), None
    )
    if helm is None:
        pytest.skip("helm not built yet (make tools)")
    values = yaml.safe_dump(chart_values(4443, store_url))
    done = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--namespace", SYSTEM_NS, "-f", "-"],
        input=values, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def test_the_charts_ingest_runs_here_with_its_learning_loop(tmp_path: Path) -> None:
    args = ingest_args(_manifest(""), 7000, tmp_path, "/kc", tmp_path / "vol")
    # the chart's own: the loop, its Job's namespace, PVC, account; the model reader
    assert f"--loop-namespace={SYSTEM_NS}" in args
    assert f"--loop-pvc={RELEASE}-store" in args
    assert f"--loop-service-account={RELEASE}-train" in args
    reader = f"--model-reader=system:serviceaccount:{SYSTEM_NS}:{RELEASE}-operator"
    assert reader in args
    # adapted to this machine, each once
    for local in ("--port=", "--tls-cert=", "--tls-key=", "--loop-interval=", "--loop-mount-path="):
        assert sum(a.startswith(local) for a in args) == 1, local
    assert "--port=7000" in args
    assert f"--loop-mount-path={tmp_path / 'vol'}" in args


def test_a_postgresql_store_reaches_the_retraining_job_without_colocation(tmp_path: Path) -> None:
    url = "postgresql://postgres@127.0.0.1:5432/dynamiccl"
    args = ingest_args(_manifest(url), 7000, tmp_path, "/kc", tmp_path / "vol")
    assert not any(a.startswith("--loop-colocate-label=") for a in args)  # SQLite only
    sqlite = ingest_args(_manifest(""), 7000, tmp_path, "/kc", tmp_path / "vol")
    assert any(a.startswith("--loop-colocate-label=") for a in sqlite)


def test_the_operator_fetches_models_with_its_own_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    args = operator_args(_manifest(""), 5000, 5001, "/kc", token)
    assert [a for a in args if a.startswith("--model-token-file=")] == [
        f"--model-token-file={token}"
    ]


def test_the_learning_policy_retrains_on_new_experience_within_the_budget() -> None:
    doc = learning_policy(canary_percent=50, budget_percent=1.0)
    spec = NCCLTuningPolicySpec.model_validate(doc["spec"])
    assert spec.exploration.budget_percent == 1.0
    assert spec.retraining.min_new_experience == 1
    assert spec.retraining.canary_percent == 50
    assert spec.model.version == "default"  # the loop's rollout decides, nothing pinned
    assert doc["spec"]["priority"] == 1000  # the loop follows it


def test_sequence_jobs_are_one_32_rank_communicator_on_the_a100_nodes() -> None:
    doc = sequence_job(3)
    assert doc["metadata"]["name"] == "train-03"
    assert doc["metadata"]["annotations"][c.ANNOTATION_PARALLELISM] == "fsdp:dp=32"
    groups = doc["spec"]["pytorchReplicaSpecs"]
    assert groups["Master"]["replicas"] + groups["Worker"]["replicas"] == 4
    for g in groups.values():
        sel = g["template"]["spec"]["nodeSelector"]
        assert sel == {c.NODE_LABEL_GFD_PRODUCT: SEQUENCE_GPU_PRODUCT}
    assert doc["spec"]["runPolicy"] == {"suspend": True}

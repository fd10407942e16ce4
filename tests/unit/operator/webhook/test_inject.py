"""`dynamiccl inject`: pods and job templates mutated with the webhook's builders."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from dynamiccl import constants as c
from dynamiccl.cli import app
from dynamiccl.operator.webhook import inject, mutate

Job = Callable[..., dict[str, Any]]
SETTINGS = inject.Settings(image="dynamiccl:test")


def test_pytorchjob_templates_are_mutated(pytorchjob: Job) -> None:
    out, notes = inject.inject(pytorchjob(), SETTINGS)
    assert notes == []
    for role in ("Master", "Worker"):
        tmpl = out["spec"]["pytorchReplicaSpecs"][role]["template"]
        assert mutate.is_injected(tmpl)
        vol = {v["name"]: v for v in tmpl["spec"]["volumes"]}[mutate.VOL_CONFIG]
        assert vol["configMap"]["name"] == "llm-dynamiccl"


def test_pod_equals_the_webhook_mutation() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {c.LABEL_KUBEFLOW_JOB_NAME: "llm"}},
        "spec": {"containers": [{"name": "t", "image": "i"}]},
    }
    out, _ = inject.inject(pod, SETTINGS)
    direct = mutate.mutate_pod(
        pod, mutate.Injection("llm", "Pod", "llm-dynamiccl", "dynamiccl:test")
    )
    assert out == direct


def test_other_objects_pass_through_with_a_note() -> None:
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    out, notes = inject.inject(svc, SETTINGS)
    assert out == svc
    assert "left alone" in notes[0]


def test_cli_yaml_json_and_bad_input(tmp_path: Path, pytorchjob: Job) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(pytorchjob()))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "kind": "NCCLTuningPolicy",
                "spec": {
                    "constraints": {
                        "envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256], "default": 256}]
                    }
                },
            }
        )
    )
    runner = CliRunner()
    res = runner.invoke(app, ["inject", "-f", str(manifest), "--policy", str(policy), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    env = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "NCCL_NTHREADS", "value": "256"} in env
    res = runner.invoke(app, ["inject", "-f", str(manifest)])
    assert res.exit_code == 0
    assert yaml.safe_load(res.stdout)["kind"] == "PyTorchJob"
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [")
    res = runner.invoke(app, ["inject", "-f", str(bad)])
    assert res.exit_code == 2
    assert "not valid YAML" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["inject", "-f", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": "x"},
                "spec": {},
            }
        )
    )
    res = runner.invoke(app, ["inject", "-f", str(broken)])
    assert res.exit_code == 2
    assert "pytorchReplicaSpecs" in res.output

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
    out, _ = inject.inject(pod, inject.Settings(image="dynamiccl:test", namespace_opted_in=True))
    direct = mutate.mutate_pod(
        pod, mutate.Injection("llm", "Pod", "llm-dynamiccl", "dynamiccl:test")
    )
    assert out == direct


def test_a_job_that_did_not_opt_in_is_left_alone(pytorchjob: Job) -> None:
    """As the webhook: no annotation and no opted-in namespace, no ConfigMap, no injection."""
    job = pytorchjob()
    del job["metadata"]["annotations"][c.ANNOTATION_TUNE]
    out, notes = inject.inject(job, SETTINGS)
    assert out == job
    assert "not opted in" in notes[0]
    assert "--namespace-opted-in" in notes[0]
    opted = inject.Settings(image="dynamiccl:test", namespace_opted_in=True)
    out, notes = inject.inject(job, opted)
    assert notes == []
    assert mutate.is_injected(out["spec"]["pytorchReplicaSpecs"]["Worker"]["template"])


def test_the_jobs_own_no_beats_an_opted_in_namespace(pytorchjob: Job) -> None:
    job = pytorchjob(annotations={c.ANNOTATION_TUNE: "false"})
    out, notes = inject.inject(job, inject.Settings(image="i", namespace_opted_in=True))
    assert out == job
    assert "not opted in" in notes[0]


def test_malformed_annotations_leave_the_job_untuned_with_the_reason(pytorchjob: Job) -> None:
    job = pytorchjob(annotations={c.ANNOTATION_TUNE: "yes please"})
    out, notes = inject.inject(job, SETTINGS)
    assert out == job
    assert "malformed annotations" in notes[0]
    assert c.ANNOTATION_TUNE in notes[0]


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
    plain = pytorchjob()
    del plain["metadata"]["annotations"][c.ANNOTATION_TUNE]
    manifest.write_text(yaml.safe_dump(plain))
    res = runner.invoke(app, ["inject", "-f", str(manifest), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == plain  # printed unchanged
    assert "not opted in" in res.stderr
    res = runner.invoke(app, ["inject", "-f", str(manifest), "--json", "--namespace-opted-in"])
    assert res.exit_code == 0, res.output
    worker = json.loads(res.stdout)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert mutate.is_injected(worker)
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
                "metadata": {"name": "x", "annotations": {c.ANNOTATION_TUNE: "true"}},
                "spec": {},
            }
        )
    )
    res = runner.invoke(app, ["inject", "-f", str(broken)])
    assert res.exit_code == 2
    assert "pytorchReplicaSpecs" in res.output

"""The demo's composition: which policy, which model per run, how sidecars run, what they sent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dynamiccl.api.tuning_policy import Mode
from dynamiccl.demo.pipeline import (
    LEARNED_POLICY,
    DemoError,
    Options,
    calls_per_run,
    load_policies,
    plugin_lib,
    sidecar_command,
    sidecar_reports,
)
from dynamiccl.demo.run import RunResult
from dynamiccl.operator.controller.policy_match import choose_model, parse_policies
from dynamiccl.operator.webhook import mutate
from dynamiccl.testing.kubelet import Volumes


def test_the_learned_sample_starts_from_default_and_retrains_after_one_job() -> None:
    docs = load_policies()
    policies, errors = parse_policies(docs)
    assert not errors
    assert {p.name for p in policies} == {"observe-everything", "ml-learned", "p5-efa-static"}
    learned = next(p for p in policies if p.name == LEARNED_POLICY)
    assert learned.spec.mode is Mode.LEARNED
    assert choose_model(learned.spec.model, "any-uid") == ("default", False)
    # the learning loop's trigger and canary share, read from the object as the loop reads it
    doc = next(d for d in docs if d["metadata"]["name"] == LEARNED_POLICY)
    assert doc["spec"]["retraining"] == {"minNewExperience": 1, "canaryPercent": 100}
    assert all(d["metadata"].get("uid") and d["metadata"].get("creationTimestamp") for d in docs)


def _pod(command: list[str]) -> dict[str, object]:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    inj = mutate.Injection(job_name="j", job_kind="PyTorchJob", config_map="cm", image="i")
    out = mutate.mutate_pod(pod, inj)
    for ct in out["spec"]["initContainers"]:
        if ct["name"] == mutate.SIDECAR:
            ct["command"] = command
    return out


def test_the_sidecar_runs_the_injected_command_with_file_coordination(tmp_path: Path) -> None:
    cmd = sidecar_command(tmp_path / "record", fast=True)
    argv, env = cmd(_pod(["dynamiccl", "sidecar"]), Volumes({}), tmp_path)
    assert argv[:4] == [sys.executable, "-m", "dynamiccl.cli", "sidecar"]
    assert argv[argv.index("--coordination") + 1] == f"file:{tmp_path / 'record'}"
    assert argv[argv.index("--epoch-interval") + 1] == "64"
    assert env == {}
    with pytest.raises(DemoError, match="not `dynamiccl"):
        cmd(_pod(["/bin/agent"]), Volumes({}), tmp_path)


def test_sidecar_reports_take_the_last_stopped_event(tmp_path: Path) -> None:
    log = tmp_path / "pod" / "sidecar.log"
    log.parent.mkdir()
    lines = [
        json.dumps({"event": "started"}),
        "2026-01-01 INFO something {not json",
        json.dumps({"event": "stopped", "acknowledged_records": 3}),
        "{broken",
        json.dumps({"event": "stopped", "acknowledged_records": 7, "acknowledged_batches": 2}),
    ]
    log.write_text("\n".join(lines))
    quiet = tmp_path / "quiet.log"
    quiet.write_text("killed before it said anything\n")
    reports = sidecar_reports(RunResult(sidecar_logs=[log, quiet]))
    assert reports == [
        {"event": "stopped", "acknowledged_records": 7, "acknowledged_batches": 2},
        {},
    ]


def test_run_lengths() -> None:
    assert calls_per_run(Options(out=Path("x"))) == 1500 * 7
    assert calls_per_run(Options(out=Path("x"), fast=True)) == 1400 * 7
    assert calls_per_run(Options(out=Path("x"), steps=20)) == 140


def test_the_plugin_build_is_found() -> None:
    assert (plugin_lib() / "libnccl-tuner-dynamiccl.so").is_file()

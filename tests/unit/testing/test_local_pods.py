"""One run: volumes, the install step, the sidecar before the ranks, SIGTERM after them."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.table import DecisionTable, scale_class
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.webhook import mutate
from dynamiccl.testing.kubelet import Volumes
from dynamiccl.testing.local_job import Cluster, Incarnation, create
from dynamiccl.testing.local_pods import (
    LocalRunError,
    RunConfig,
    RunResult,
    run,
    sidecar_command,
    sidecar_reports,
)
from dynamiccl.testing.nccl_player import default_so
from dynamiccl.testing.workload import TimeTable, cfg_key

ROOT = Path(__file__).resolve().parents[3]
N = 4096

FAKE_SIDECAR = """
import json, os, signal, sys, time
from pathlib import Path
from dynamiccl.sidecar import shm
out = Path(sys.argv[1])
shm.create(Path(os.environ["DYNAMICCL_SHM_PATH"]), 64)
(out / "env.json").write_text(json.dumps(dict(os.environ)))
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while not stop:
    time.sleep(0.01)
(out / "stopped").write_text("yes")
"""


def _spec() -> TopologySpec:
    return TopologySpec(
        name="box",
        gpu="H100",
        gpus_per_node=2,
        nodes=1,
        intra="nvswitch",
        nvlink_GBps=450,
        nvls=False,
        pcie_gen=5,
        nics_per_node=1,
        nic_Gbps=100,
        fabric="infiniband",
        sharp=False,
    )


def _incarnation() -> Incarnation:
    job = yaml.safe_load((ROOT / "examples" / "pytorchjob.yaml").read_text())
    del job["spec"]["pytorchReplicaSpecs"]["Worker"]
    job["spec"]["nprocPerNode"] = "2"
    limits = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    limits["resources"]["limits"]["nvidia.com/gpu"] = 2
    pol = yaml.safe_load((ROOT / "examples" / "policies" / "observe-only.yaml").read_text())

    def compiler(f: StateFeatures, s: NCCLTuningPolicySpec, v: str) -> DecisionTable:
        return DecisionTable(version=1, scales=(scale_class(2, 1),))

    return create(
        job,
        Cluster.of(_spec(), "ml-team", {}),
        parse_policies([pol])[0],
        rng=random.Random(0),
        image="img",
        ingest_url="",
        ingest_ca="",
        compiler=compiler,
    )


def _times(tmp_path: Path) -> Path:
    cost = [[-1.0] * 3 for _ in range(7)]
    cost[1][0] = 10.0
    t = TimeTable(
        topology="box",
        nranks=2,
        nnodes=1,
        cost={f"4:{N}": cost},
        nccl_channels={f"4:{N}:1:0": 2},
        nccl_default_us={f"4:{N}": 30.0},
        nccl_default={f"4:{N}": (1, 0, 2)},
        mean_us={cfg_key(4, N, 1, 0, 0, 0): 30.0},
    )
    t.write(tmp_path / "t.json")
    return tmp_path / "t.json"


def _config(tmp_path: Path, sidecar: Any) -> RunConfig:
    if not default_so().exists():
        pytest.skip("plugin not built (make plugin)")
    return RunConfig(
        steps=50,
        seed=1,
        time_table=_times(tmp_path),
        image_lib=default_so().parent,
        ops=[(4, N, 1)],
        sidecar=sidecar,
    )


def test_sidecar_first_ranks_next_sigterm_last(tmp_path: Path) -> None:
    inc = _incarnation()
    marker = tmp_path / "sidecar"
    marker.mkdir()

    def sidecar(
        pod: Mapping[str, Any], vols: Volumes, pdir: Path
    ) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", FAKE_SIDECAR, str(marker)], {"EXTRA": "1"}

    seen: list[tuple[int, int]] = []
    res = run(
        inc,
        _config(tmp_path, sidecar),
        tmp_path / "run",
        lambda p: "tok",
        lambda d, t: seen.append((d, t)),
    )
    assert [r.rank for r in res.ranks] == [0, 1]
    assert all(r.calls == 50 and r.mapped for r in res.ranks)  # the sidecar's file was there
    assert res.sidecar_exit == [0]
    assert (marker / "stopped").read_text() == "yes"  # SIGTERM, not SIGKILL
    env = json.loads((marker / "env.json").read_text())
    assert env["EXTRA"] == "1"
    config_dir = Path(env[c.ENV_CONFIG_DIR])
    assert json.loads((config_dir / "job.json").read_text())["uid"] == inc.uid
    assert Path(env[c.ENV_INGEST_TOKEN_FILE]).read_text() == "tok"
    assert seen[-1] == (100, 100)


def test_without_a_sidecar_nccl_decides(tmp_path: Path) -> None:
    res = run(_incarnation(), _config(tmp_path, None), tmp_path / "run", lambda p: "t")
    assert res.sidecar_exit == []
    assert all(not r.mapped for r in res.ranks)
    assert all(r.decisions == {f"4:{N}": {"1:0:0:0": 50}} for r in res.ranks)


def test_a_failing_rank_fails_the_run_with_its_log(tmp_path: Path) -> None:
    cfg = _config(tmp_path, None)
    bad = RunConfig(**{**cfg.__dict__, "ops": [(4, 999, 1)]})  # a call the table does not know
    with pytest.raises(LocalRunError, match="KeyError"):
        run(_incarnation(), bad, tmp_path / "run", lambda p: "t")


def test_a_sidecar_that_dies_fails_the_run(tmp_path: Path) -> None:
    def sidecar(
        pod: Mapping[str, Any], vols: Volumes, pdir: Path
    ) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", "raise SystemExit('no config')"], {}

    with pytest.raises(LocalRunError, match="no config"):
        run(_incarnation(), _config(tmp_path, sidecar), tmp_path / "run", lambda p: "t")


def test_relative_paths_work_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path, None)
    monkeypatch.chdir(tmp_path)
    rel = RunConfig(**{**cfg.__dict__, "time_table": Path("t.json")})
    res = run(_incarnation(), rel, Path("relative-run"), lambda p: "t")
    assert [r.calls for r in res.ranks] == [50, 50]


def _pod(command: list[str]) -> dict[str, object]:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    inj = mutate.Injection(job_name="j", job_kind="PyTorchJob", config_map="cm", image="i")
    out = mutate.mutate_pod(pod, inj)
    for ct in out["spec"]["initContainers"]:
        if ct["name"] == mutate.SIDECAR:
            ct["command"] = command
    return out


def test_the_sidecar_runs_the_injected_command_with_file_coordination(tmp_path: Path) -> None:
    cmd = sidecar_command(tmp_path / "record")
    argv, env = cmd(_pod(["dynamiccl", "sidecar"]), Volumes({}), tmp_path)
    assert argv[:4] == [sys.executable, "-m", "dynamiccl.cli", "sidecar"]
    assert argv[argv.index("--coordination") + 1] == f"file:{tmp_path / 'record'}"
    assert argv[argv.index("--epoch-interval") + 1] == "64"
    assert argv[argv.index("--min-proposal-interval") + 1] == "3"
    assert env == {}
    with pytest.raises(LocalRunError, match="not `dynamiccl"):
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

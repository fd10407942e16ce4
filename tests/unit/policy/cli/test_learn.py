"""CLI contracts: `policy decide`, `bench tune`, `bench suite`, `train` (JSON keys, bad input)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dynamiccl.api.topology import parse_topology
from dynamiccl.cli import app
from dynamiccl.policy.sim.simulator import NoiseModel, Simulator
from dynamiccl.policy.sim.surface import generate, to_csv
from dynamiccl.policy.sim.system import derive_spec

RUNNER = CliRunner()
NODE: dict[str, Any] = {
    "name": "h200x5",
    "gpu": "H200",
    "gpus_per_node": 5,
    "nodes": 1,
    "intra": "nvswitch",
    "nvlink_GBps": 450,
    "nvls": True,
    "pcie_gen": 5,
    "nics_per_node": 0,
    "nic_Gbps": 0,
    "fabric": "none",
    "sharp": False,
}


@pytest.fixture
def topo(tmp_path: Path) -> Path:
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(NODE))
    return p


def _run(*args: str) -> Any:
    return RUNNER.invoke(app, list(args))


def test_decide_json(topo: Path) -> None:
    res = _run(
        "policy",
        "decide",
        "--topology",
        str(topo),
        "--collective",
        "allreduce",
        "--bytes",
        str(8 << 30),
        "--json",
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert {"algo", "proto", "nchannels", "chunk_bytes"} <= set(doc)
    assert doc["nccl_default"]["algo"] == "ring"
    # 5 Hopper GPUs: NVLS beats NCCL's Ring at 8 GiB (departure nvls-small-team).
    assert doc["algo"] == "nvls"


def test_decide_with_job_and_policy(topo: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "world_size": 5,
                "gpus_per_pod": 5,
                "replicas": 1,
                "nproc_per_node": 5,
                "topology": {"ccl_library": "nccl"},
                "workload": {"parallelism": "fsdp"},
            }
        )
    )
    pol = tmp_path / "pol.yaml"
    pol.write_text(yaml.safe_dump({"spec": {"constraints": {"allowedAlgorithms": ["ring"]}}}))
    res = _run(
        "policy",
        "decide",
        "--topology",
        str(topo),
        "--job",
        str(job),
        "--policy",
        str(pol),
        "--collective",
        "allreduce",
        "--bytes",
        str(8 << 30),
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["algo"] == "ring"


@pytest.mark.parametrize(
    ("change", "args", "needle"),
    [
        ({"gpu": "X100"}, [], "gpu"),
        ({"intra": "pcie", "nvls": True, "nvlink_GBps": 0}, [], "nvls"),
        ({}, ["--collective", "alltoall"], "collective"),
        ({}, ["--bytes", "-1"], "bytes"),
        ({}, ["--model", "/nonexistent.pt"], "model file not found"),
    ],
)
def test_decide_bad_input(
    tmp_path: Path, change: dict[str, Any], args: list[str], needle: str
) -> None:
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump({**NODE, **change}))
    base = {"--collective": "allreduce", "--bytes": "1024"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    flat = [x for kv in base.items() for x in kv]
    res = _run("policy", "decide", "--topology", str(p), *flat, "--json")
    assert res.exit_code == 2
    assert needle in res.output
    assert "Traceback" not in res.output


def test_bench_tune(topo: Path, tmp_path: Path) -> None:
    spec = parse_topology(NODE)
    surf = generate(Simulator(spec, noise=NoiseModel(stddev=0.04)), sizes=(1 << 12, 1 << 30))
    s = tmp_path / "s.csv"
    s.write_text(to_csv(surf))
    res = _run(
        "bench",
        "tune",
        "--surface",
        str(s),
        "--topology",
        str(topo),
        "--budget",
        "200",
        "--seed",
        "3",
        "--json",
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["buckets"]) == 10
    for b in doc["buckets"]:
        assert {"collective", "nbytes", "chosen", "best", "nccl_default", "regret"} <= set(b)
        assert b["regret"] <= 0.03
        assert b["chosen"]["time_us"] / b["best"]["time_us"] - 1 == pytest.approx(b["regret"])
    _ = derive_spec


def test_bench_tune_peers(topo: Path, tmp_path: Path) -> None:
    """`--peers`: the existing document plus one row per strategy, same buckets and seed."""
    spec = parse_topology(NODE)
    surf = generate(Simulator(spec, noise=NoiseModel(stddev=0.04)), sizes=(1 << 12, 1 << 30))
    s = tmp_path / "s.csv"
    s.write_text(to_csv(surf))
    args = ["bench", "tune", "--surface", str(s), "--topology", str(topo), "--budget", "200"]
    res = _run(*args, "--peers", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert all("exploration_cost" in b for b in doc["buckets"])
    rows = {r["strategy"]: r for r in doc["peers"]["rows"]}
    assert {"DynamICCL", "NCCL default", "coordinate descent", "uniform"} <= set(rows)
    assert all(r["runs"] == len(doc["buckets"]) for r in rows.values())
    assert rows["DynamICCL"]["mean_regret"] == pytest.approx(doc["mean_regret"])
    assert rows["DynamICCL"]["exploration_cost"] == pytest.approx(doc["mean_exploration_cost"])
    # uniform spreads the budget over every configuration: it costs the most
    assert rows["uniform"]["exploration_cost"] == max(r["exploration_cost"] for r in rows.values())
    text = _run(*args, "--peers")
    assert "coordinate descent" in text.output


def test_bench_tune_bad_surface(topo: Path, tmp_path: Path) -> None:
    s = tmp_path / "s.csv"
    s.write_text("collective,nbytes,algo,proto,nchannels,time_us,stddev_us\n")
    res = _run("bench", "tune", "--surface", str(s), "--topology", str(topo), "--budget", "10")
    assert res.exit_code == 2
    assert "no valid row" in res.output
    res = _run(
        "bench",
        "tune",
        "--surface",
        str(tmp_path / "nope.csv"),
        "--topology",
        str(topo),
        "--budget",
        "10",
    )
    assert res.exit_code == 2
    assert "cannot read" in res.output
    s.write_text(
        "collective,nbytes,algo,proto,nchannels,time_us,stddev_us\nallreduce,8,ring,ll,,1,0\n"
    )
    res = _run("bench", "tune", "--surface", str(s), "--topology", str(topo), "--budget", "0")
    assert res.exit_code == 2
    assert "budget" in res.output


def test_bench_suite_static(tmp_path: Path) -> None:
    res = _run("bench", "suite", "--budget", "0", "--out", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["topologies"]) >= 10
    assert doc["static"]["oracle_fraction"] >= 0.97
    assert (tmp_path / "suite_speedup.png").exists()


def test_train_cli(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "seed": 2,
                "hidden": 8,
                "calls_per_job": 2,
                "eval_jobs": 2,
                "stages": [{"dataset_jobs": 2, "imitation_steps": 1, "ppo_iterations": 0}] * 3,
            }
        )
    )
    out = tmp_path / "m"
    res = _run("train", "--config", str(cfg), "--out", str(out), "--version", "t1", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["version"] == "t1"
    assert (out / "model.pt").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: nope\n")
    res = _run("train", "--config", str(bad), "--out", str(out))
    assert res.exit_code == 2
    assert "seed" in res.output

"""hack/gpu_ddp.py without a GPU: the DynamICCL run's orchestration end to end (the operator's
decision and compiled table for the 1-GPU-per-node TCP topology, the webhook, each pod's plugin
install step and sidecar with file coordination, the reward ingest), with exactly one stand-in:
the DDP rank (fake_ddp_rank.py, which fails unless it gets the injected plugin env and the
one-GPU layout). Step times and rewards on real NCCL need the GPU run (hack/gpu_run.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dynamiccl.testing import scripts

gpu_ddp = scripts.load("gpu_ddp")

ROOT = Path(__file__).resolve().parents[3]


def test_step_stats_and_overhead(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text('{"step_s": [0.010, 0.012], "buckets": [[1, 100.0], [1, 300.0]]}')
    b.write_text('{"step_s": [0.011, 0.011], "buckets": [[1, 200.0], [1, 200.0]]}')
    st = gpu_ddp.step_stats([a, b])
    assert st["steps"] == 2
    assert st["step_ms_mean"] == pytest.approx(11.5)  # per step the slowest rank: 11, 12
    assert st["buckets_per_step"] == 1.0
    assert st["bucket_us_mean"] == pytest.approx(200.0)
    assert gpu_ddp.overhead({"step_ms_mean": 10.0}, {"step_ms_mean": 10.1}) == pytest.approx(0.01)
    assert gpu_ddp.overhead({"step_ms_mean": None}, {"step_ms_mean": 10.1}) is None


def test_job_manifest_has_one_pod_per_rank() -> None:
    job = gpu_ddp.job_manifest(4)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 4
    assert job["metadata"]["annotations"]["dynamiccl.io/parallelism"] == "dp:dp=4"


def test_dynamiccl_run_through_operator_webhook_and_sidecars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    so = ROOT / "plugin" / "build" / "dist" / "x86_64" / "libnccl-tuner-dynamiccl.so"
    if not so.exists():
        subprocess.run(["make", "-s", "-C", str(ROOT / "plugin"), "dist"], check=True)
    monkeypatch.setattr(gpu_ddp, "RANK", Path(__file__).with_name("fake_ddp_rank.py"))
    monkeypatch.setenv("EXPECT_PLUGIN", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    got = gpu_ddp.run_dynamiccl(2, 1, so, tmp_path, 5)
    assert "mode learned" in got["decision"]
    assert "2 ranks on 2 node(s)" in got["decision"]  # each rank its own node
    assert got["table_cells"] > 0  # the operator compiled a table for the topology
    assert got["sidecar_exit"] == [0, 0]
    assert [s["event"] for s in got["sidecars"]] == ["stopped", "stopped"]
    assert got["tables_agreed"]["files"] == 2
    assert got["tables_agreed"]["agreed"]
    steps = sorted(tmp_path.rglob("rank*.json.steps.json"))
    assert len(steps) == 2
    assert gpu_ddp.step_stats(steps)["step_ms_mean"] == pytest.approx(11.0)

"""hack/gpu_report.py: the run's summary from what its steps left; a missing step is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamiccl.testing import scripts
from dynamiccl.testing.nccl_player import default_so

gpu_report = scripts.load("gpu_report")
gpu_sweep = scripts.load("gpu_sweep")

ROOT = Path(__file__).resolve().parents[3]


def test_summary_of_a_partial_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep at 2 ranks ran (its one stand-in for NCCL, fake_sweep_worker.py); the rest
    did not: the report has the sweep's figures and names the three missing steps."""
    monkeypatch.setattr(gpu_sweep, "WORKER", Path(__file__).with_name("fake_sweep_worker.py"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    gpu_sweep.run_world(2, 1, [4096, 1 << 20], default_so(), work)
    (work / "facts.json").write_text('{"gpus": ["NVIDIA H100, 580.1"]}')
    assert gpu_report.main(["--work", str(work), "--out", str(out), "--command", "x"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["missing"] == ["ddp 2 ranks", "sweep 4 ranks", "ddp 4 ranks"]
    assert s["facts"] == {"gpus": ["NVIDIA H100, 580.1"]}
    md = (out / "report.md").read_text()
    assert "## Surface, 2 ranks" in md
    assert "| allreduce | 1048576 | ring/" in md
    assert "| ring/simple/1 |" in md
    assert sorted(p.name for p in out.iterdir()) == [
        "nccl-pick-2.csv", "report.md", "summary.json", "surface-2.csv"
    ]  # fmt: skip

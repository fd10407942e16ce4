"""Suite plots are real PNG files."""

from __future__ import annotations

from pathlib import Path

from dynamiccl.policy.eval.plots import plot_all
from dynamiccl.policy.eval.suite import run_suite
from dynamiccl.policy.train.inference import new_policy


def test_plots(tmp_path: Path) -> None:
    pol = new_policy(0, hidden=8)
    pol.net.eval()
    rep = run_suite(pol, budget=0, names=["h100-nvls", "l40s-pcie"], sizes=(8, 1 << 20))
    assert rep.tuned is None
    paths = plot_all(rep, tmp_path / "plots")
    assert [p.name for p in paths] == ["suite_speedup.png", "suite_summary.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.stat().st_size > 10_000

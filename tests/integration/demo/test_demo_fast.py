"""`dynamiccl demo --fast`: the whole loop with real processes, as a new user runs it.

16 rank processes load the real plugin, 2 `dynamiccl sidecar` sidecars, the
operator's ingest over HTTPS into SQLite, one retraining, a second run on the
canary model. Asserts what issue #8 asks of `make demo`, on the short variant.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

STEPS_FAST = 1400  # dynamiccl.demo.pipeline.STEPS_FAST
RANKS = 16


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], Path]:
    cwd = tmp_path_factory.mktemp("demo")
    out = cwd / "demo-out"  # the default output directory, relative to where the user runs it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "DYNAMICCL_"))}
    done = subprocess.run(
        [sys.executable, "-m", "dynamiccl.cli", "demo", "--fast", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert isinstance(summary, dict)
    return summary, out


def test_the_second_run_beats_nccls_default(demo: tuple[dict[str, object], Path]) -> None:
    s, _ = demo
    runs = s["runs"]
    assert isinstance(runs, list)
    # the job's initial table (and later the tuner's) took effect in both runs
    assert all(r["tables_committed"] >= 1 for r in runs), runs
    geomean = s["speedup_geomean"]
    assert isinstance(geomean, int | float)
    assert geomean > 1.05, runs
    buckets = s["buckets"]
    assert isinstance(buckets, list)
    assert len(buckets) == 5
    for b in buckets:
        assert b["speedup"][1] > 0.95, b  # the guardrail: never much worse than NCCL's choice


def test_every_reward_sent_was_stored_once(demo: tuple[dict[str, object], Path]) -> None:
    s, _ = demo
    assert s["rewards_sent"] == s["rewards_ingested"]
    assert isinstance(s["rewards_sent"], int)
    assert s["rewards_sent"] > 0


def test_every_collective_call_of_every_rank_reached_the_store(
    demo: tuple[dict[str, object], Path],
) -> None:
    s, _ = demo
    for b in s["buckets"]:  # type: ignore[attr-defined]
        repeat = 2 if b["collective"] in ("allgather", "reducescatter") else 1
        assert b["calls"] == [STEPS_FAST * repeat * RANKS] * 2, b


def test_stored_times_are_what_the_ranks_measured(demo: tuple[dict[str, object], Path]) -> None:
    """Ring -> sidecar aggregation -> ingest -> store changes no time (means within 0.5 %)."""
    s, out = demo
    for k, run in enumerate(("run-1", "run-2")):
        sums: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for path in (out / run).glob("*/rank*.json"):
            if path.name.endswith(".args.json"):
                continue
            rep = json.loads(path.read_text())
            for key, total in rep["time_us"].items():
                coll, nbytes = (int(x) for x in key.split(":"))
                calls = sum(rep["decisions"][key].values())
                sums[(coll, nbytes)][0] += total
                sums[(coll, nbytes)][1] += calls
        names = {"allreduce": 4, "allgather": 2, "reducescatter": 3}
        for b in s["buckets"]:  # type: ignore[attr-defined]
            total, calls = sums[(names[b["collective"]], b["nbytes"][0])]
            assert b["run_us"][k] == pytest.approx(total / calls, rel=0.005), (run, b)


def test_one_retraining_made_a_canary_that_served_run_two(
    demo: tuple[dict[str, object], Path],
) -> None:
    s, _ = demo
    versions = s["model_versions"]
    assert isinstance(versions, list)
    assert len(versions) >= 2
    assert versions[0] == "default"
    runs = s["runs"]
    assert isinstance(runs, list)
    assert (runs[0]["model_version"], runs[0]["canary"]) == ("default", False)
    assert (runs[1]["model_version"], runs[1]["canary"]) == (versions[-1], True)
    models = {m["version"]: m for m in s["models"]}  # type: ignore[attr-defined]
    assert models[versions[-1]]["parent"] == "default"
    assert models[versions[-1]]["status"] == "canary"
    assert len(models[versions[-1]]["sha256"]) == 64


def test_the_plot_and_the_report_are_written(demo: tuple[dict[str, object], Path]) -> None:
    s, out = demo
    png = Path(str(s["plot"]))
    assert png.parent == out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = Path(str(s["report"])).read_text()
    assert "| collective |" in report
    assert "demo.png" in report
    assert json.loads((out / "summary.json").read_text()) == s

"""`dynamiccl demo --fast` as a new user runs it: jobs in a row learn what NCCL does not know.

Four jobs of 30 000 calls on the harness-played cluster (the plugin `.so`, the sidecar's own
`Runner` with file coordination, the ingest over HTTPS into SQLite, the learning loop and
`dynamiccl train --from-store` as a process; `dynamiccl/demo/harness_job.py` says what stands
in). Asserts what the user should see happen: the first job's exploration finds where the
surface departs from NCCL's model within its budget, a second job confirms it, every job from
the third starts with it and is more than 5 % faster than the first, and the retraining learned
from every row in the store.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    cwd = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "DYNAMICCL_"))}
    done = subprocess.run(
        [sys.executable, "-m", "dynamiccl.cli", "demo", "--fast"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, cwd / "demo-out"  # the default output directory, where the user ran it


def _value(out: str, pattern: str) -> tuple[str, ...]:
    m = re.search(pattern, out, re.MULTILINE)
    assert m is not None, (pattern, out)
    return m.groups()


def test_exploration_finds_the_departure_within_budget(story: tuple[str, Path]) -> None:
    out, _ = story
    assert _value(out, r"^found by exploration: job (\d+) ") == ("1",)
    cost, budget = _value(
        out, r"^largest exploration cost of a job: ([\d.]+) % .*budget ([\d.]+) %"
    )
    assert 0 < float(cost) <= float(budget)


def test_later_jobs_start_with_it_and_are_faster(story: tuple[str, Path]) -> None:
    out, _ = story
    (held,) = _value(out, r"^the class's finding holds .*: after job (\d+)")
    assert int(held) <= 2
    (first_with,) = _value(out, r"^every job starts with it from: job (\d+) ")
    assert int(first_with) <= 3
    speedups, first = _value(
        out, r"^speedups of the jobs that started with it: (.*) \(first job ([\d.]+)\)"
    )
    later = [float(x) for x in speedups.split(", ")]
    assert len(later) >= 4 - int(first_with) + 1
    assert min(later) > 1.05 * float(first), out


def test_the_retraining_learned_from_every_row_of_the_store(story: tuple[str, Path]) -> None:
    out, work = story
    used, read = _value(out, r"^the last retraining .* used (\d+) of the store's (\d+) rows")
    assert int(used) == int(read) > 0
    assert (work / "store.sqlite").is_file()
    assert len(list((work / "models").iterdir())) == 1 + 4  # default and one retraining per job

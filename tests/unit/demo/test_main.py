"""`dynamiccl demo`: its options, a new demo in a used directory, and what it prints.

The sequence it runs (`LearningSequence`) has its own tests (test_learning_sequence.py); here
the command is run on a short sequence, the story's lines checked for what they say.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from dynamiccl.cli import app


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(app, ["demo", "--help"])
    assert result.exit_code == 0
    for opt in ("--out", "--jobs", "--calls", "--fast", "--seed"):
        assert opt in result.output


def test_too_few_calls_or_no_jobs_are_refused() -> None:
    assert CliRunner().invoke(app, ["demo", "--calls", "3"]).exit_code == 2
    assert CliRunner().invoke(app, ["demo", "--jobs", "0"]).exit_code == 2


def test_a_demo_in_a_used_directory_starts_from_a_fresh_store(tmp_path: Path) -> None:
    """Two demos of two jobs in one directory: the second registers no more versions than the
    first (a store left from the first would add its versions to the second's) and says how
    many of its store's rows the retraining used: all of them (every job's features are in the
    store, so `train --from-store` skips none)."""
    outs = []
    for _ in range(2):  # each in its own process, as users run it (the plugin is loaded per job)
        done = subprocess.run(
            [sys.executable, "-m", "dynamiccl.cli", "demo", "--jobs", "2", "--calls", "2000",
             "--out", str(tmp_path)],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(done.stdout)
    versions = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert len(versions) == 3, versions  # default and one retraining per job of the second
    for out in outs:
        (line,) = [ln for ln in out.splitlines() if ln.startswith("the last retraining")]
        used, read = re.search(r"used (\d+) of the store's (\d+) rows", line).groups()  # type: ignore[union-attr]
        assert int(used) == int(read) > 0, line

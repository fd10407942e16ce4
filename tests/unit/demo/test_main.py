"""`dynamiccl demo`: options, and one clear line for what the user must fix."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dynamiccl.cli import app


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(app, ["demo", "--help"])
    assert result.exit_code == 0
    for opt in ("--out", "--fast", "--json", "--model", "--steps", "--seed"):
        assert opt in result.output


def test_a_missing_model_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["demo", "--model", str(tmp_path / "nope.pt"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"dynamiccl demo: --model {tmp_path / 'nope.pt'}: no such file"
    ]


def test_a_model_file_that_is_no_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    result = CliRunner().invoke(app, ["demo", "--model", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.startswith("dynamiccl demo:")]
    assert len(lines) == 1
    assert "not a DynamICCL model" in lines[0]
    assert "Traceback" not in result.output


def test_too_few_steps_are_refused() -> None:
    result = CliRunner().invoke(app, ["demo", "--steps", "3"])
    assert result.exit_code == 2

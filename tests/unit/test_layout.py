"""The repository layout keeps its promises: one namespace, no stdlib shadowing."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dynamiccl.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("operator", "policy", "node_agent", "sidecar")


@pytest.mark.parametrize("component", COMPONENTS)
def test_component_folder_is_served_under_the_namespace(component: str) -> None:
    link = ROOT / "dynamiccl" / component
    assert link.is_symlink()
    assert link.resolve() == (ROOT / component).resolve()


@pytest.mark.parametrize("component", COMPONENTS)
def test_component_folder_is_not_a_regular_top_level_package(component: str) -> None:
    # A regular package named `operator` at the root would shadow the stdlib.
    assert not (ROOT / component / "__init__.py").exists()


def test_repository_root_on_sys_path_does_not_shadow_stdlib() -> None:
    code = "import operator, sys; print(operator.__file__); print(operator.itemgetter)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    first = out.splitlines()[0]
    assert str(ROOT) not in first, f"root package shadows stdlib: {first}"


def test_no_top_level_module_shadows_the_standard_library() -> None:
    names = {p.stem for p in ROOT.iterdir() if p.suffix == ".py" or p.is_dir()}
    shadowing = sorted(n for n in names if n in sys.stdlib_module_names)
    # `operator` is a folder without __init__.py (namespace portion): harmless.
    assert shadowing in ([], ["operator"]), shadowing


def test_every_design_command_exists() -> None:
    runner = CliRunner()
    for cmd in (
        ["demo"],
        ["sim", "predict"],
        ["sim", "calibrate"],
        ["policy", "decide"],
        ["bench", "tune"],
        ["bench", "suite"],
        ["discover"],
        ["inject"],
        ["operator"],
        ["sidecar"],
        ["ingest"],
        ["node-agent"],
        ["train"],
    ):
        result = runner.invoke(app, [*cmd, "--help"])
        assert result.exit_code == 0, (cmd, result.output)


def test_test_collection_never_walks_a_directory_symlink() -> None:
    # Recorded sysfs trees link back into themselves; pytest walking one never finishes.
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    skip = ini["norecursedirs"]
    walked: list[str] = []
    for top, dirs, _files in os.walk(ROOT / "tests"):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, pat) for pat in skip)]
        walked += [str(Path(top, d)) for d in dirs if Path(top, d).is_symlink()]
    assert walked == [], f"pytest would follow these directory symlinks: {walked[:5]}"

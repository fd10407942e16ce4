"""The runtime ships no test support: neither `dynamiccl.testing` nor the demo that plays NCCL
through it (`dynamiccl.demo`) is in the wheel, and nothing the runtime image runs needs them.

The wheel is built the way the Dockerfile's wheel stage builds it (the same files copied,
`pip wheel --no-deps`), in a temporary folder, and its file list is read. The import check
runs in a fresh interpreter where `import dynamiccl.testing` fails exactly as when it is not
installed (`sys.modules["dynamiccl.testing"] = None`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.unit.without_module import ROOT, cli, import_every_module, run

# What the Dockerfile's wheel stage copies before `pip wheel`.
_WHEEL_INPUTS = (
    "pyproject.toml",
    "README.md",
    "dynamiccl",
    "operator",
    "policy",
    "sidecar",
    "node_agent",
)


def _wheel_names(tmp: Path) -> list[str]:
    src = tmp / "src"
    src.mkdir()
    for name in _WHEEL_INPUTS:
        path = ROOT / name
        if path.is_dir():
            # dynamiccl/<component> are symlinks to the component folders: keep them links.
            shutil.copytree(
                path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*pip, "-w", str(tmp / "wheels"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp / "wheels").glob("dynamiccl-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


@pytest.mark.slow
def test_the_wheel_leaves_test_support_out(tmp_path: Path) -> None:
    names = _wheel_names(tmp_path)
    assert "dynamiccl/sidecar/runner.py" in names  # the runtime is there
    assert "dynamiccl/operator/controller/handlers.py" in names
    assert [n for n in names if n.startswith(("dynamiccl/testing/", "dynamiccl/demo/"))] == []


def test_every_runtime_module_imports_without_test_support() -> None:
    imported = import_every_module(
        "dynamiccl.testing", ("operator", "sidecar", "node_agent", "api", "policy")
    )
    assert "dynamiccl.operator.controller.handlers" in imported
    assert "dynamiccl.sidecar.runner" in imported
    assert "dynamiccl.node_agent.cli" in imported
    assert len(imported) > 100


def test_the_runtime_commands_start_without_test_support_and_demo() -> None:
    for command in ("operator", "sidecar", "node-agent", "inject", "train"):
        done = run(cli("dynamiccl.testing", "dynamiccl.demo"), command, "--help")
        assert done.returncode == 0, (command, done.stderr[-2000:])
        assert "Usage" in done.stdout
    demo = run(cli("dynamiccl.testing", "dynamiccl.demo"), "demo", "--fast")
    assert demo.returncode == 2, demo.stderr[-2000:]
    assert demo.stderr.strip().splitlines() == [
        "dynamiccl demo: the demo runs from a source checkout of DynamICCL (`make demo`): it plays "
        "NCCL through the test tools and the plugin built there, which an installed dynamiccl "
        "does not ship"
    ]

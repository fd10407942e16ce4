"""The runtime image has no torch (`pip install dynamiccl`; torch is the `train` extra).

Each check runs in a fresh interpreter where `import torch` fails exactly as
when it is not installed (`sys.modules["torch"] = None`): every module of the
operator, the sidecar agent and the node agent imports; the commands those
components and their users run do their real work; `dynamiccl train` says
what to install instead of a traceback.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_TORCH = 'import sys; sys.modules["torch"] = None\n'
CLI = NO_TORCH + (
    "from dynamiccl.cli import main\nsys.argv = ['dynamiccl', *sys.argv[1:]]\nmain()\n"
)


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_torch_is_only_the_training_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")]
    assert [d for d in project["optional-dependencies"]["train"] if d.startswith("torch")]


def test_every_runtime_module_imports_without_torch() -> None:
    code = NO_TORCH + (
        "import importlib, pkgutil\n"
        "import dynamiccl.operator, dynamiccl.agent, dynamiccl.node_agent, dynamiccl.api\n"
        "bad = []\n"
        "for pkg in (dynamiccl.operator, dynamiccl.agent, dynamiccl.node_agent, dynamiccl.api):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except ImportError as exc:\n"
        "            bad.append(f'{m.name}: {exc}')\n"
        "        else:\n"
        "            print(m.name)\n"
        "assert not bad, bad\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = done.stdout.split()
    assert "dynamiccl.operator.controller.handlers" in imported
    assert "dynamiccl.agent.runner" in imported
    assert len(imported) > 60


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["operator", "--help"], "webhook"),
        (["agent", "--help"], "coordination"),
        (["node-agent", "--help"], "interval"),
        (["discover", "--root", "tests/fixtures/hosts/dgx-h100", "--json"], '"gpus"'),
        (["inject", "-f", "examples/pytorchjob.yaml"], "dynamiccl-agent"),
        (
            [
                "policy",
                "decide",
                "--topology",
                "examples/topology-aws-p5-2node.yaml",
                "--collective",
                "allreduce",
                "--bytes",
                "1048576",
                "--json",
            ],
            '"nccl_default"',
        ),
    ],
)
def test_runtime_commands_work_without_torch(args: list[str], expect: str) -> None:
    done = _run(CLI, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stdout


def test_train_without_torch_says_what_to_install(tmp_path: Path) -> None:
    done = _run(CLI, "train", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "dynamiccl[train]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()

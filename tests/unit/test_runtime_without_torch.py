"""The runtime image has no torch (`pip install dynamiccl`; torch is the `train` extra).

Each check runs in a fresh interpreter where `import torch` fails exactly as
when it is not installed (`sys.modules["torch"] = None`): every module of the
operator, the sidecar agent and the node agent imports; the commands those
components and their users run do their real work; `dynamiccl train` says
what to install instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.without_module import blocked, cli, only_in_extra, run

NO_TORCH = blocked("torch")
CLI = cli("torch")


def test_torch_is_only_the_training_extra() -> None:
    assert only_in_extra("torch", "train")


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
    done = run(code)
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
    done = run(CLI, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stdout


def test_train_without_torch_says_what_to_install(tmp_path: Path) -> None:
    done = run(CLI, "train", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "dynamiccl[train]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()

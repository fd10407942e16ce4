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

from tests.unit.without_module import cli, import_every_module, only_in_extra, run

CLI = cli("torch")


def test_torch_is_only_the_training_extra() -> None:
    assert only_in_extra("torch", "train")


def test_every_runtime_module_imports_without_torch() -> None:
    imported = import_every_module("torch", ("operator", "sidecar", "node_agent", "api"))
    assert "dynamiccl.operator.controller.handlers" in imported
    assert "dynamiccl.sidecar.runner" in imported
    assert len(imported) > 60


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["operator", "--help"], "webhook"),
        (["sidecar", "--help"], "coordination"),
        (["node-agent", "--help"], "interval"),
        (["discover", "--root", "tests/fixtures/hosts/dgx-h100", "--json"], '"gpus"'),
        (["inject", "-f", "examples/pytorchjob.yaml"], "dynamiccl-sidecar"),
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

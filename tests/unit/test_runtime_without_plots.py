"""The runtime has no matplotlib (the `plots` extra; the runtime image leaves it out).

Each check runs in a fresh interpreter where `import matplotlib` fails exactly as
when it is not installed (`sys.modules["matplotlib"] = None`): every module of
the operator, the sidecar agent, the node agent and the policy runtime imports;
the command that draws (`bench suite --out`) says what to
install, before any work and without a traceback.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.without_module import cli, import_every_module, only_in_extra, run

CLI = cli("matplotlib")


def test_matplotlib_is_only_the_plots_extra() -> None:
    assert only_in_extra("matplotlib", "plots")


def test_every_runtime_module_imports_without_matplotlib() -> None:
    imported = import_every_module(
        "matplotlib",
        ("operator", "sidecar", "node_agent", "api", "policy.runtime", "policy.online"),
    )
    assert "dynamiccl.operator.controller.handlers" in imported
    assert "dynamiccl.sidecar.runner" in imported
    assert len(imported) > 60


def test_bench_suite_plots_without_matplotlib_say_what_to_install(tmp_path: Path) -> None:
    done = run(CLI, "bench", "suite", "--budget", "0", "--out", str(tmp_path / "plots"))
    assert done.returncode == 2
    assert "dynamiccl[plots]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "plots").exists()

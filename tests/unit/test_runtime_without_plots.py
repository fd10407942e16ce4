"""The runtime has no matplotlib (the `plots` extra; the runtime image leaves it out).

Each check runs in a fresh interpreter where `import matplotlib` fails exactly as
when it is not installed (`sys.modules["matplotlib"] = None`): every module of
the operator, the sidecar agent, the node agent and the policy runtime imports;
the commands that draw (`dynamiccl demo`, `bench suite --out`) say what to
install, before any work and without a traceback.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.without_module import blocked, cli, only_in_extra, run

NO_PLOTS = blocked("matplotlib")
CLI = cli("matplotlib")


def test_matplotlib_is_only_the_plots_extra() -> None:
    assert only_in_extra("matplotlib", "plots")


def test_every_runtime_module_imports_without_matplotlib() -> None:
    code = NO_PLOTS + (
        "import importlib, pkgutil\n"
        "import dynamiccl.cli\n"
        "names = ('operator', 'agent', 'node_agent', 'api', 'policy.runtime', 'policy.online')\n"
        "bad, done = [], []\n"
        "for n in names:\n"
        "    pkg = importlib.import_module('dynamiccl.' + n)\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except ImportError as exc:\n"
        "            bad.append(f'{m.name}: {exc}')\n"
        "        else:\n"
        "            done.append(m.name)\n"
        "assert not bad, bad\n"
        "print(*done)\n"
    )
    done = run(code)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = done.stdout.split()
    assert "dynamiccl.operator.controller.handlers" in imported
    assert "dynamiccl.agent.runner" in imported
    assert len(imported) > 60


def test_demo_without_matplotlib_says_what_to_install(tmp_path: Path) -> None:
    done = run(CLI, "demo", "--fast", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "dynamiccl[plots]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_bench_suite_plots_without_matplotlib_say_what_to_install(tmp_path: Path) -> None:
    done = run(CLI, "bench", "suite", "--budget", "0", "--out", str(tmp_path / "plots"))
    assert done.returncode == 2
    assert "dynamiccl[plots]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "plots").exists()

"""A fresh interpreter in which one module is missing, for the runtime-without-X tests.

`sys.modules[name] = None` makes `import name` fail exactly as when it is not installed.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def blocked(module: str) -> str:
    """Code that makes ``import module`` fail in the interpreter it starts."""
    return f'import sys; sys.modules["{module}"] = None\n'


def cli(*modules: str) -> str:
    """The `dynamiccl` command with ``modules`` missing (its arguments follow the code)."""
    return "".join(blocked(m) for m in modules) + (
        "from dynamiccl.cli import main\nsys.argv = ['dynamiccl', *sys.argv[1:]]\nmain()\n"
    )


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` in the repository root."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def only_in_extra(dist: str, extra: str) -> bool:
    """``dist`` is not a dependency of the package but is one of ``extra``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return not [d for d in project["dependencies"] if d.startswith(dist)] and bool(
        [d for d in project["optional-dependencies"][extra] if d.startswith(dist)]
    )


def import_every_module(module: str, packages: tuple[str, ...]) -> list[str]:
    """With ``module`` missing, import `dynamiccl.cli` and every module under the
    `dynamiccl.<package>` packages; the names imported (an ImportError fails the test)."""
    code = blocked(module) + (
        "import importlib, pkgutil\n"
        "import dynamiccl.cli\n"
        f"names = {packages!r}\n"
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
    return done.stdout.split()

"""The commands in hack/ as modules, for their tests and the tests that use their output.

hack/'s scripts are commands (run as ``python3 hack/NAME.py``, some on machines without
dynamiccl); they import their siblings by name, as a script's own folder is on ``sys.path``.
`load` imports one the same way: hack/ is on ``sys.path`` only while it loads, so nothing
else resolves a name against hack/.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

HACK = Path(__file__).resolve().parents[2] / "hack"


class ScriptError(ImportError):
    """The name is no script of hack/, or a module of that name from elsewhere is loaded."""


def load(name: str) -> ModuleType:
    """hack/NAME.py, imported once under NAME (as the scripts import each other)."""
    path = HACK / f"{name}.py"
    if not path.is_file():
        raise ScriptError(f"no script {path}")
    module = sys.modules.get(name)
    if module is None:
        sys.path.insert(0, str(HACK))
        try:
            module = importlib.import_module(name)
        finally:
            sys.path.remove(str(HACK))
    if Path(str(module.__file__)).resolve() != path.resolve():
        raise ScriptError(f"{name} is already imported from {module.__file__}, not {path}")
    return module

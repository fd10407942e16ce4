"""hack/slim_venv.py: what the runtime image's venv loses, and that what is left still works.

Stand-in: a site-packages folder made here (a package with a test suite and a
`testing` module, a kubernetes with `client` and `aio`, an extension module and
an auditwheel-style `<dist>.libs/` library built with gcc -g) instead of the
image's venv; hack/images.sh builds the real one (its runtime stage imports
every component module there).
"""

from __future__ import annotations

import ast
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from dynamiccl.testing import scripts

slim_venv = scripts.load("slim_venv")

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("dynamiccl", "operator", "agent", "node_agent", "policy")

needs_gcc = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("strip")), reason="needs gcc and strip"
)


def _so(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text(body)
    subprocess.run(["gcc", "-g", "-O0", "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
    src.unlink()


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    for rel in (
        "numpy/__init__.py",
        "numpy/testing/__init__.py",
        "numpy/_core/tests/test_a.py",
        "numpy/tests/test_b.py",
        "kubernetes/__init__.py",
        "kubernetes/client/__init__.py",
        "kubernetes/aio/__init__.py",
        "kubernetes/aio/client/api.py",
        "tests/__init__.py",  # a top-level package of that name is a module, not a suite
    ):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x = 1\n")
    return site


def test_suites_and_kubernetes_aio_go_modules_stay(tmp_path: Path) -> None:
    site = _site(tmp_path)
    removed = slim_venv.slim(site)
    assert not (site / "numpy/_core/tests").exists()
    assert not (site / "numpy/tests").exists()
    assert not (site / "kubernetes/aio").exists()
    for kept in ("numpy/testing/__init__.py", "kubernetes/client/__init__.py", "tests/__init__.py"):
        assert (site / kept).is_file(), kept
    assert len(removed) == 3


@needs_gcc
def test_extension_modules_lose_debug_sections_and_still_load(tmp_path: Path) -> None:
    site = _site(tmp_path)
    body = "int answer(int x) { int y = x * 2; return y + 2; }\n"
    ext = site / "pkg" / "_ext.cpython-311-x86_64-linux-gnu.so"
    grafted = site / "pkg.libs" / "libgrafted-0123abcd.so"
    _so(ext, body)
    _so(grafted, body)
    before, grafted_bytes = ext.stat().st_size, grafted.read_bytes()
    slim_venv.slim(site)
    assert ext.stat().st_size < before
    assert ctypes.CDLL(str(ext)).answer(20) == 42
    assert grafted.read_bytes() == grafted_bytes  # patchelf-edited files are left alone


def test_main_reports_sizes_and_refuses_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _site(tmp_path)
    assert slim_venv.main([str(site)]) == 0
    out = capsys.readouterr().out
    assert "removed kubernetes/aio" in out
    assert "site-packages:" in out
    assert slim_venv.main([str(tmp_path / "nope")]) == 2


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_module_of_ours_imports_what_the_image_drops() -> None:
    files = [p for d in SOURCES for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 100
    bad = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in files
        for name in _imports(p)
        if name == "kubernetes.aio" or name.startswith("kubernetes.aio.")
    ]
    assert not bad, bad

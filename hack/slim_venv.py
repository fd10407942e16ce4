#!/usr/bin/env python3
"""Slim the runtime image's virtualenv: drop what nothing there runs.

The runtime image (operator, ingest, sidecar, node agent) is pulled onto every
GPU node. The Dockerfile's deps stage runs this on the installed dependencies:

* test suites shipped inside packages (`tests` and `test` folders: numpy's,
  websocket-client's, ...; `numpy.testing` and the like are modules and stay);
* `kubernetes.aio`, the client's asyncio copy (about as big as the client
  itself): `import kubernetes` does not load it and dynamiccl never imports it
  (tests/unit/test_slim_venv.py checks the sources);
* debug sections of extension modules (`strip --strip-debug`). Libraries that
  auditwheel grafted into `<dist>.libs/` are left alone (patchelf-edited files;
  little debug data in them).

What stays: the `.pyc` files pip wrote (the containers run with a read-only
root filesystem, so nothing could cache bytecode at run time; from source each
start of the sidecar takes seconds longer) and every package's metadata
(`pip check`, `importlib.metadata`).

usage: slim_venv.py SITE_PACKAGES   (needs `strip`; Debian: binutils)
Prints what it removed and the bytes before and after.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TEST_DIRS = ("tests", "test")
UNUSED_PACKAGES = ("kubernetes/aio",)
GRAFTED_LIBS = ".libs"


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under root (symlinks not followed)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def suite_dirs(site: Path) -> list[Path]:
    """Test-suite folders inside packages, outermost only."""
    found = sorted(p for p in site.rglob("*") if p.is_dir() and p.name in TEST_DIRS)
    outer: list[Path] = []
    for p in found:
        if p.parent != site and not any(p.is_relative_to(o) for o in outer):
            outer.append(p)
    return outer


def extension_modules(site: Path) -> list[Path]:
    """Shared objects of the packages, not those under a `<dist>.libs/` folder."""
    return sorted(
        p
        for p in site.rglob("*.so")
        if p.is_file()
        and not p.is_symlink()
        and not any(part.endswith(GRAFTED_LIBS) for part in p.relative_to(site).parts)
    )


def slim(site: Path) -> list[str]:
    """Apply the cuts above to site; returns one line per removed tree."""
    removed: list[str] = []
    for rel in UNUSED_PACKAGES:
        p = site / rel
        if p.is_dir():
            removed.append(f"{rel}: {tree_bytes(p)} bytes")
            shutil.rmtree(p)
    for p in suite_dirs(site):
        removed.append(f"{p.relative_to(site)}: {tree_bytes(p)} bytes")
        shutil.rmtree(p)
    sos = [str(p) for p in extension_modules(site)]
    if sos:
        subprocess.run(["strip", "--strip-debug", *sos], check=True)
    return removed


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    site = Path(argv[0])
    before = tree_bytes(site)
    for line in slim(site):
        print(f"removed {line}")
    print(f"site-packages: {before} -> {tree_bytes(site)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The carry folder for a lent GPU machine (no network there) and its size check.

`.gpu-carry/` (git-ignored through .gitignore) holds what hack/gpu_run.sh needs beyond the
repository, which travels by itself:

- `plugin/`: the plugin's x86_64 glibc-2.17 build (`make -C plugin dist`);
- `wheels/`: the distributions the drivers import that the machine's image lacks, for CPython
  3.12 on manylinux x86_64, at this virtualenv's versions (`pip download --no-deps`).

The drivers' import closure is read from a subprocess that imports them (`closure`); the image's
packages are its 'cuda' image list (IMAGE_HAS). Everything that travels (tracked and untracked,
not ignored files, plus the carry) must stay under the device tool's 64 MiB (`check_size`).

usage: .venv/bin/python hack/gpu_carry.py [--no-download]   (prints the sizes; exit 1 if over)
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".gpu-carry"
LIMIT = 64 << 20  # the device tool's working tree + carry limit
MARGIN = 4 << 20  # room for files other sessions add before the run
# In the lent machines' 'cuda' image (its package list as read on 2026-11-17), among what the
# drivers import; the lent machine's python3 is CPython 3.12 with CUDA torch. typing-extensions
# is carried although the image has one: pydantic needs a recent one and PYTHONPATH puts ours first.
IMAGE_HAS = frozenset(
    {
        "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "attrs", "click",
        "frozenlist", "idna", "multidict", "numpy", "prometheus-client", "propcache", "pyyaml",
        "rich", "shellingham", "typer", "yarl", "torch",
    }
)  # fmt: skip
DRIVERS = (
    "gpu_sweep", "gpu_ddp", "gpu_ddp_rank", "dynamiccl.cli", "dynamiccl.sidecar.cli",
    "dynamiccl.sidecar.runner", "dynamiccl.testing.local_ingest", "dynamiccl.testing.local_pods",
    "dynamiccl.policy.runtime.numpy_policy", "dynamiccl.policy.runtime.compile",
)  # fmt: skip
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_34_x86_64", "manylinux1_x86_64")  # fmt: skip


def canonical(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure() -> list[str]:
    """The distributions (canonical names) the drivers import, torch excluded, read from a
    fresh interpreter that imports them (hack/ on its path, as when they run)."""
    code = (
        "import sys, json, importlib, importlib.metadata as md\n"
        f"sys.path.insert(0, {str(ROOT / 'hack')!r})\n"
        f"for m in {list(DRIVERS)!r}: importlib.import_module(m)\n"
        "pd = md.packages_distributions()\n"
        "tops = {m.split('.')[0] for m in list(sys.modules)}\n"
        "print(json.dumps(sorted({d for t in tops for d in pd.get(t, [])})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return sorted({canonical(d) for d in json.loads(out.stdout)} - {"dynamiccl"})


def missing(needed: Iterable[str], image: Iterable[str] = IMAGE_HAS) -> list[str]:
    """What must be carried: needed and not in the image (canonical names)."""
    have = {canonical(n) for n in image}
    return sorted({canonical(n) for n in needed} - have)


def download(dists: Iterable[str], dest: Path) -> None:
    """Each distribution's wheel for CPython 3.12 manylinux x86_64 at this venv's version."""
    dest.mkdir(parents=True, exist_ok=True)
    for d in dists:
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]  # fmt: skip
        for p in PLATFORMS:
            argv += ["--platform", p]
        subprocess.run([*argv, f"{d}=={md.version(d)}"], check=True)


def check_size(sizes: Mapping[str, int], limit: int = LIMIT, margin: int = MARGIN) -> str:
    """'' when the files fit under limit - margin, else what is over and the largest files."""
    total = sum(sizes.values())
    if total <= limit - margin:
        return ""
    big = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    return f"{total} bytes travel, over {limit - margin}; largest: " + ", ".join(
        f"{p} {n}" for p, n in big
    )


def travelling(root: Path = ROOT, carry: Path = CARRY) -> dict[str, int]:
    """Sizes of what travels: tracked and untracked-not-ignored files, and the carry folder."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    sizes = {}
    for rel in filter(None, out.decode().split("\0")):
        p = root / rel
        if p.is_file() and not p.is_symlink():
            sizes[rel] = p.stat().st_size
    for p in carry.rglob("*"):
        if p.is_file():
            sizes[str(p.relative_to(root))] = p.stat().st_size
    return sizes


def build(carry: Path = CARRY, *, fetch: bool = True) -> None:
    """Fill the carry folder: the x86_64 plugin build and (fetch) the missing wheels."""
    subprocess.run(["make", "-s", "-C", str(ROOT / "plugin"), "dist"], check=True)
    plug = carry / "plugin"
    plug.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "plugin/build/dist/x86_64/libnccl-tuner-dynamiccl.so", plug)
    if fetch:
        shutil.rmtree(carry / "wheels", ignore_errors=True)
        download(missing(closure()), carry / "wheels")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--no-download", action="store_true", help="keep the wheels already there")
    args = ap.parse_args(argv)
    build(fetch=not args.no_download)
    sizes = travelling()
    carried = sum(n for p, n in sizes.items() if p.startswith(CARRY.name))
    print(f"gpu-carry: {len(list((CARRY / 'wheels').glob('*.whl')))} wheels, {carried} bytes "
          f"carried, {sum(sizes.values())} bytes travel in all (limit {LIMIT})")  # fmt: skip
    err = check_size(sizes)
    if err:
        print(f"gpu-carry: FAILED: {err}")
    return 1 if err else 0


if __name__ == "__main__":
    sys.exit(main())

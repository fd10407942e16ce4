#!/usr/bin/env python3
"""Make PyPI's CUDA torch a CPU torch: replace its big CUDA libraries with stubs.

PyPI's Linux x86_64 torch is the CUDA build; the CPU-only wheels live on an
index CI machines cannot reach. On a machine without a GPU the CUDA runtime
(libcudart, kept) reports no device, so torch never calls cuBLAS, cuDNN, cuFFT,
cuSPARSE, cuSOLVER, NCCL, NVRTC, NVSHMEM, ... but its libraries are linked
against them (DT_NEEDED), so the dynamic loader must find them to import torch.

This script replaces each such library under SITE/nvidia with a stub of the
same soname that exports the same dynamic symbols under the same versions
(functions return 0; objects and thread-locals are zero-filled blocks of their
size), deletes the libraries nothing links against (cuDNN's engine libraries,
which libcudnn dlopens only on a GPU, profiler hosts, static archives, headers)
and deletes triton (torch.compile's GPU code generator; optional for torch).
The packages' metadata stays, so a later `pip install` finds torch's
requirements met and does not bring the files back.
What stays real: torch's own libraries, libcudart and libcupti (torch's CPU
library calls into them; with no driver they answer "no device").

usage: torch_cpu_stubs.py SITE_PACKAGES   (needs gcc, readelf; Debian: gcc binutils)
Prints one line per library and the bytes saved. `python -c "import torch"` and
a CPU training step must still work afterwards (the Dockerfile's trainer stage
checks both).
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KEEP = ("libcudart.so", "libcupti.so")  # real: torch's CPU library calls them
RETURN_ZERO = {"x86_64": ("xor %eax,%eax", "ret"), "aarch64": ("mov x0, #0", "ret")}
LIB = re.compile(r"\.so(\.\d+)*$")
SYM = re.compile(r"^\s*\d+:\s+[0-9a-f]+\s+(\d+|0x[0-9a-f]+)\s+(\w+)\s+(\w+)\s+\w+\s+(\S+)\s+(\S+)")


def readelf(*args: str) -> str:
    return subprocess.run(
        ["readelf", "-W", *args], capture_output=True, text=True, check=True
    ).stdout


def needed(path: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d", str(path)))


def soname(path: Path) -> str:
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", readelf("-d", str(path)))
    return m.group(1) if m else path.name


def exported(path: Path) -> list[tuple[str, int, str, str]]:
    """(name, size, type, version) of every defined global/weak dynamic symbol."""
    out = []
    for line in readelf("--dyn-syms", str(path)).splitlines():
        m = SYM.match(line)
        if not m or m.group(4) in ("UND", "ABS") or m.group(3) not in ("GLOBAL", "WEAK"):
            continue
        size, typ, name = int(m.group(1), 0), m.group(2), m.group(5)
        name, _, version = name.partition("@")
        if version.startswith("@"):
            version = version[1:]
        elif version:  # a non-default (hidden) version: nothing links against it
            continue
        if typ in ("FUNC", "IFUNC", "NOTYPE", "OBJECT", "TLS") and name:
            out.append((name, size, typ, version))
    return out


def stub(path: Path, work: Path) -> None:
    """Replace `path` with a stub library of the same soname, symbols and versions."""
    syms = exported(path)
    asm = [".text"]
    for name, _, typ, _ in syms:
        if typ in ("FUNC", "IFUNC", "NOTYPE"):
            asm += [
                f'.globl "{name}"',
                f'.type "{name}",@function',
                f'"{name}":',
                *RETURN_ZERO[platform.machine()],
            ]
    for section, kind in ((".bss", "OBJECT"), ('.section .tbss,"awT",@nobits', "TLS")):
        asm.append(section)
        for name, size, typ, _ in syms:
            if typ == kind:
                n = max(size, 8)
                asm += [".balign 16", f'.globl "{name}"', f'.type "{name}",@object',
                        f'.size "{name}",{n}', f'"{name}":', f".zero {n}"]  # fmt: skip
    versions: dict[str, list[str]] = {}
    for name, _, _, version in syms:
        versions.setdefault(version, []).append(name)

    def quoted(names: list[str]) -> str:
        return " ".join('"' + n + '";' for n in names)

    plain = versions.pop("", [])
    if not versions:  # an unversioned library: one anonymous node
        script = [f"{{ global: {quoted(plain)} local: *; }};"]
    else:  # unversioned symbols join the first node (a reference without a version takes any)
        first = next(iter(versions))
        versions[first] += plain
        script = [f"{v} {{ global: {quoted(names)} }};" for v, names in versions.items()]
    (work / "stub.S").write_text("\n".join(asm) + "\n")
    (work / "stub.map").write_text("\n".join(script) + "\n")
    out = work / "stub.so"
    subprocess.run(
        ["gcc", "-shared", "-nostdlib", "-o", str(out), str(work / "stub.S"),
         f"-Wl,-soname,{soname(path)}", f"-Wl,--version-script={work / 'stub.map'}"],
        check=True,
    )  # fmt: skip
    path.unlink()
    shutil.copyfile(out, path)
    path.chmod(0o755)


def size(p: Path) -> int:
    if p.is_symlink() or not p.exists():
        return 0
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def main(site: Path) -> int:
    nvidia, torch_lib = site / "nvidia", site / "torch" / "lib"
    if not (torch_lib / "libtorch_cuda.so").exists():
        print(f"{site}: no CUDA torch here; nothing to do")
        return 0
    before = size(site)
    libs = {p.name: p for p in nvidia.rglob("*") if LIB.search(p.name) and p.is_file()}
    # what torch's own libraries (and the kept ones) load through DT_NEEDED
    roots = list(torch_lib.glob("*.so*")) + [p for n, p in libs.items() if n.startswith(KEEP)]
    wanted = {n for r in roots for n in needed(r) if n in libs}
    for name, path in sorted(libs.items()):
        if name.startswith(KEEP):
            print(f"keep  {name}")
        elif name in wanted:
            with tempfile.TemporaryDirectory() as tmp:
                stub(path, Path(tmp))
            print(f"stub  {name}")
        else:
            path.unlink()
            print(f"drop  {name}")
    for junk in [*nvidia.rglob("*.a"), *nvidia.rglob("include"), site / "triton"]:
        if junk.is_dir():
            shutil.rmtree(junk)
        elif junk.exists():
            junk.unlink()
    print(f"torch_cpu_stubs: {before / 1e9:.2f} GB -> {size(site) / 1e9:.2f} GB in {site}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1])))

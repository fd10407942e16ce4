"""`make -C plugin test`: -Werror build, export check, the C test table + dlopen smoke test,
the short libFuzzer run over the committed corpus, and the portable builds (glibc <= 2.17,
x86_64 and aarch64; the aarch64 C tests and the ctypes harness tests in an aarch64 CPython, both
under qemu) -- this is how `make test` runs them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_plugin_make_test_passes() -> None:
    # A session of its own, killed as a whole on timeout: make's children (apt-get, the
    # fuzzers) would otherwise keep the pipes open and hang the test past its timeout.
    proc = subprocess.Popen(
        ["make", "-s", "-C", str(ROOT / "plugin"), "test"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(
            "make -C plugin test took over 900 s\n" + (stdout + stderr)[-4000:]
        ) from exc
    out = stdout + stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^\d+ passed, 0 failed$", stdout, re.M), out[-2000:]
    assert "exports: OK" in stdout
    for arch in ("X86-64", "AArch64"):
        glibc = rf"{arch}, highest GLIBC_2\.\d+ \(<= GLIBC_2\.17\), exports OK"
        assert re.search(glibc, stdout), out[-4000:]
    qemu = r"aarch64 glibc-2\.17 build under qemu-aarch64\S*\n\d+ passed, 0 failed"
    assert re.search(qemu, stdout), out[-4000:]
    harness = (
        r"aarch64 python3\.11 under qemu-aarch64\S*, against the aarch64 \.so\n[1-9]\d* passed in"
    )
    assert re.search(harness, stdout), out[-4000:]
    for target in ("fuzz_shm", "fuzz_table", "fuzz_profiler"):
        assert re.search(rf"fuzz {target}: \d+ executions, 0 crashes", stdout), out[-2000:]

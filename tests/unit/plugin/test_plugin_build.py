"""`make -C plugin test`: -Werror build, export check, the C test table + dlopen smoke test,
and the short libFuzzer run over the committed corpus (this is how `make test` runs them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_plugin_make_test_passes() -> None:
    proc = subprocess.run(
        ["make", "-s", "-C", str(ROOT / "plugin"), "test"],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^\d+ passed, 0 failed$", proc.stdout, re.M), out[-2000:]
    assert "exports: OK" in proc.stdout
    for target in ("fuzz_shm", "fuzz_table", "fuzz_profiler"):
        assert re.search(rf"fuzz {target}: \d+ executions, 0 crashes", proc.stdout), out[-2000:]

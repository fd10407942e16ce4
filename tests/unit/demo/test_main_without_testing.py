"""`dynamiccl demo` from an installed wheel: the wheel leaves `dynamiccl.testing` out (the NCCL
player the demo plays its jobs through), so the demo says in one line that it runs from a source
checkout (`make demo`) and exits 2, before it writes anything.

The installed wheel is simulated by a fresh interpreter in which `import dynamiccl.testing` fails
as when it is not installed (tests/unit/without_module.py;
tests/unit/test_runtime_without_testing.py checks that the wheel indeed leaves it out).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.without_module import cli, run


@pytest.mark.parametrize("mode", [["--fast"], ["--jobs", "2", "--calls", "1000"]])
def test_demo_without_test_support_says_make_demo_and_exits_2(
    tmp_path: Path, mode: list[str]
) -> None:
    out = tmp_path / "out"
    done = run(cli("dynamiccl.testing"), "demo", *mode, "--out", str(out))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("dynamiccl demo: ")
    assert "source checkout" in lines[0]
    assert "make demo" in lines[0]
    assert "Traceback" not in done.stderr
    assert not out.exists()  # refused before it wrote anything

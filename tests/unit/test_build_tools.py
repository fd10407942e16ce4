"""hack/build-tools.sh on bad input: one clear line, and a half-built cache is never used.

Each case runs the real script against an empty cache directory with the network cut
(GOPROXY=off), so it fails fast at the step under test instead of building anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "build-tools.sh"
HELM_VERSION = next(
    line.split("=", 1)[1].strip().strip('"')
    for line in (ROOT / "hack" / "versions.env").read_text().splitlines()
    if line.startswith("HELM_VERSION=")
)


def _run(cache: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DYNAMICCL_CACHE": str(cache), "GOPROXY": "off"}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


def test_missing_go_toolchain_is_one_clear_line(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "dirname", "sha256sum", "cut", "cat", "mkdir", "awk", "grep"):
        found = shutil.which(tool)
        assert found, tool
        (bindir / tool).symlink_to(found)
    res = _run(tmp_path / "cache", "helm", path=str(bindir))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("hack/build-tools.sh: error: go toolchain not found (need go >= ")


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the go toolchain")
def test_failed_module_download_names_the_group_and_its_log(tmp_path: Path) -> None:
    res = _run(tmp_path / "cache", "helm")
    assert res.returncode == 1
    errors = _error_lines(res.stderr)
    assert len(errors) == 1, res.stderr
    assert f"failed to download modules for helm {HELM_VERSION}" in errors[0]
    log = Path(errors[0].rsplit("see ", 1)[1])
    assert log.is_file()
    assert log.stat().st_size > 0
    # nothing that looks built was left behind
    assert not list((tmp_path / "cache" / "bin").glob("helm-*"))


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the go toolchain")
@pytest.mark.parametrize("stamp", [None, "fingerprint=0000000000000000\n"])
def test_a_half_built_tool_is_rebuilt_not_used(tmp_path: Path, stamp: str | None) -> None:
    tool = tmp_path / "cache" / "bin" / f"helm-{HELM_VERSION}"
    tool.mkdir(parents=True)
    (tool / "helm").write_text("#!/bin/sh\necho half-built\n")
    (tool / "helm").chmod(0o755)
    if stamp is not None:  # a stamp from another wrapper-module fingerprint
        (tool / ".complete").write_text(f"name=helm\nversion={HELM_VERSION}\n{stamp}")
    res = _run(tmp_path / "cache", "helm")
    assert "(cached)" not in res.stderr
    assert f"build  helm {HELM_VERSION}" in res.stderr  # it tried to rebuild...
    assert res.returncode == 1  # ...and, with the network cut, said so
    assert "failed to download modules for helm" in res.stderr
    # tool_bin (what cluster-up uses) refuses the unstamped or stale directory too
    probe = subprocess.run(
        ["bash", "-c", f"source {ROOT / 'hack' / 'lib.sh'}; tool_bin helm"],
        check=False,
        env={**os.environ, "DYNAMICCL_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    if stamp is None:
        assert probe.returncode == 1
        assert "is not built" in probe.stderr


def test_unknown_group_is_refused(tmp_path: Path) -> None:
    res = _run(tmp_path / "cache", "kubernets")
    assert res.returncode == 1
    assert "unknown group 'kubernets'" in res.stderr

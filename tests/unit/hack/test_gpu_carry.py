"""hack/gpu_carry.py: what the lent GPU machine needs carried, and the 64 MiB check."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dynamiccl.testing import scripts

gpu_carry = scripts.load("gpu_carry")


def test_closure_of_the_drivers_and_what_the_image_lacks() -> None:
    need = gpu_carry.closure()
    assert {"pydantic", "pydantic-core", "cryptography", "atomics", "jsonpatch"} <= set(need)
    assert "dynamiccl" not in need
    carry = gpu_carry.missing(need)
    assert "pydantic" in carry
    assert "typing-extensions" in carry
    assert "numpy" not in carry  # in the image
    assert "aiohttp" not in carry
    assert gpu_carry.missing(["PyYAML", "Pydantic_Core"], ["pyyaml"]) == ["pydantic-core"]


def test_size_check_refuses_over_the_limit_and_names_the_largest() -> None:
    assert gpu_carry.check_size({"a": 10, "b": 20}, limit=40, margin=10) == ""
    err = gpu_carry.check_size({"a": 10, "big.whl": 25}, limit=40, margin=10)
    assert "35 bytes travel, over 30" in err
    assert err.index("big.whl") < err.index("a 10")


def test_travelling_counts_tracked_untracked_and_carry_not_ignored(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored/\n.gpu-carry/\n")
    (tmp_path / "tracked.py").write_bytes(b"x" * 100)
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "big").write_bytes(b"x" * 1000)
    carry = tmp_path / ".gpu-carry"
    (carry / "wheels").mkdir(parents=True)
    (carry / "wheels" / "w.whl").write_bytes(b"x" * 50)
    sizes = gpu_carry.travelling(tmp_path, carry)
    assert sizes == {".gitignore": 21, "tracked.py": 100, ".gpu-carry/wheels/w.whl": 50}


def test_this_checkout_fits() -> None:
    """What travels from this checkout now (the carry folder if built) is under the limit."""
    assert gpu_carry.check_size(gpu_carry.travelling()) == ""

"""dynamiccl.testing.scripts: hack/'s commands load as their siblings import them, and hack/
is on sys.path only while one loads."""

from __future__ import annotations

import sys

import pytest

from dynamiccl.testing import scripts


def test_a_script_and_the_sibling_it_imports_are_one_module_each() -> None:
    gpu_sweep = scripts.load("gpu_sweep")  # imports nccl_log by name, as when run
    assert scripts.load("nccl_log") is sys.modules["nccl_log"]
    assert gpu_sweep.nccl_log is scripts.load("nccl_log")
    assert scripts.load("gpu_sweep") is gpu_sweep
    assert str(scripts.HACK) not in sys.path


def test_a_name_that_is_no_script_is_refused() -> None:
    with pytest.raises(scripts.ScriptError, match="no script"):
        scripts.load("no_such_script")


def test_a_module_of_the_same_name_from_elsewhere_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "gen_nodes", pytest)
    with pytest.raises(scripts.ScriptError, match="already imported"):
        scripts.load("gen_nodes")

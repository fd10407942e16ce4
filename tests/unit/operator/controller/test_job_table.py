"""The table a job starts with: compiled when a compiler has the model, else NCCL's choice
with the reason; compiled tables cached, failures and missing models not remembered.

Stand-ins: compilers (plain functions) and, for the shipped model, the policy package's
modules replaced in sys.modules."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.controller import configmap as cm
from dynamiccl.operator.controller import job_table as jt
from tests.topology_samples import h100_job

JOB = cm.JobRef("kubeflow.org/v1", "PyTorchJob", "llm", "team-a", "uid-1")


def _features() -> StateFeatures:
    return StateFeatures.model_validate(h100_job(nodes=1))


def _policy(**kw: object) -> NCCLTuningPolicySpec:
    return NCCLTuningPolicySpec.model_validate(kw)


def test_observe_mode_leaves_every_cell_to_nccl() -> None:
    table = jt.initial_table(_features(), _policy(mode="observe"), jt.SHIPPED_MODEL_VERSION)
    assert table["cells"] == []
    assert (table["default"], table["reason"]) == ("nccl", "observe")


@pytest.mark.parametrize("mode", ["static", "learned"])
def test_tuning_modes_get_the_shipped_models_compiled_table(mode: str) -> None:
    """The shipped compiler's table, not NCCL passthrough with a reason: on one NVSwitch node
    the shipped model agrees with NCCL's pick everywhere, so a static table forces nothing and
    a learned one carries exploration candidates in every cell it lists."""
    table = jt.initial_table(_features(), _policy(mode=mode), jt.SHIPPED_MODEL_VERSION)
    assert "reason" not in table, table.get("reason")
    assert table["scales"]
    explore = [cell for cell in table["cells"] if cell.get("candidates")]
    assert bool(explore) == (mode == "learned")
    assert len(explore) == len(table["cells"])


def test_a_compiler_without_the_model_version_leaves_nccl_in_charge() -> None:
    table = jt.initial_table(_features(), _policy(mode="learned"), "v9", lambda f, p, v: None)
    assert table["cells"] == []
    assert table["reason"] == "no-model:v9"


def test_a_failing_compiler_leaves_nccl_in_charge() -> None:
    def broken(features: StateFeatures, policy: NCCLTuningPolicySpec, version: str) -> object:
        raise RuntimeError("model file layout v2 does not match v3")

    table = jt.initial_table(_features(), _policy(mode="static"), "default", broken)
    assert table["cells"] == []
    assert table["default"] == "nccl"
    assert table["reason"].startswith("compile-error: RuntimeError: model file layout v2")
    obj = cm.build(JOB, _features(), "gold", _policy(mode="static"), model_version="default",
                   canary=False, compiler=broken)  # fmt: skip
    assert json.loads(obj["data"][cm.KEY_TABLE]) == table


def test_a_shipped_model_that_fails_to_load_is_reported_once_and_nccl_decides(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loads: list[Path] = []

    class Policy:
        @staticmethod
        def load(path: Path) -> object:
            loads.append(path)
            raise ValueError("observation layout v2 does not match this code's v3")

    model = tmp_path / "default.npz"
    model.write_bytes(b"x")
    numpy_policy = types.SimpleNamespace(DEFAULT_NPZ=model, NumpyPolicy=Policy)
    compiler = types.SimpleNamespace(compile_table=lambda m, f, p: {"cells": ["never"]})
    monkeypatch.setitem(sys.modules, "dynamiccl.policy.runtime.numpy_policy", numpy_policy)
    monkeypatch.setitem(sys.modules, "dynamiccl.policy.runtime.compile", compiler)
    jt._shipped_policy.cache_clear()
    jt._TABLES.clear()  # tables an earlier test compiled with the real shipped model
    try:
        assert "shipped model unusable (ValueError: observation layout v2" in jt.warm_up()
        for _ in range(3):
            table = jt.initial_table(_features(), _policy(mode="static"), "default")
            assert table["cells"] == []
            assert table["reason"].startswith("compile-error: RuntimeError: ValueError")
        assert loads == [model]  # loaded once, the failure remembered
    finally:
        jt._shipped_policy.cache_clear()


def test_compiled_tables_are_reused_for_identical_inputs() -> None:
    calls: list[str] = []

    def compiler(features: StateFeatures, policy: NCCLTuningPolicySpec, version: str) -> object:
        calls.append(version)
        return {"version": 3, "cells": [[1, 2]], "compiled_for": version}

    first = jt.initial_table(_features(), _policy(mode="static"), "v1", compiler)
    again = jt.initial_table(_features(), _policy(mode="static"), "v1", compiler)
    assert again == first
    assert calls == ["v1"]  # the second reconcile of the same job compiles nothing
    again["cells"].append("mutated by a caller")
    assert jt.initial_table(_features(), _policy(mode="static"), "v1", compiler) == first
    jt.initial_table(_features(), _policy(mode="static"), "v2", compiler)
    jt.initial_table(_features(), _policy(mode="learned"), "v1", compiler)
    assert calls == ["v1", "v2", "v1"]  # another version or policy: compiled again


def test_missing_models_and_failures_are_not_remembered() -> None:
    calls: list[int] = []

    def flaky(features: StateFeatures, policy: NCCLTuningPolicySpec, version: str) -> object:
        calls.append(1)
        if len(calls) == 1:
            return None
        if len(calls) == 2:
            raise RuntimeError("transient")
        return {"version": 3, "cells": []}

    reasons = [
        jt.initial_table(_features(), _policy(mode="static"), "v1", flaky).get("reason")
        for _ in range(4)
    ]
    assert reasons == ["no-model:v1", "compile-error: RuntimeError: transient", None, None]
    assert len(calls) == 3

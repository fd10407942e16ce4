"""Compiled tables are byte-identical to the recorded ones (compile_golden.py).

The digests were written by the compile before it was batched across scale classes
(commit eb29c8a), so this shows the faster compile ships exactly the same tables: the
table JSON, and the table after an exploration assignment (fresh and with a coverage).
Seven jobs (1 to 7 scale classes; NVSwitch, PCIe + RoCE, EFA, 4-GPU pods), four policy
specs (learned, fewer candidates, static, constrained) and three models.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.runtime.compile import compile_table
from dynamiccl.policy.runtime.exploration import assign
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ, file_sha256
from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy
from tests.unit.policy.runtime.compile_golden import (
    GOLDEN,
    MODELS,
    SPECS,
    coverage_of,
    digest,
    jobs,
    outcomes,
)


@cache
def golden() -> dict[str, Any]:
    out: dict[str, Any] = json.loads(GOLDEN.read_text())
    return out


@cache
def model(name: str) -> NumpyPolicy:
    return MODELS[name]()


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("job_name", sorted(jobs()))
def test_tables_are_byte_identical_to_the_recorded_ones(model_name: str, job_name: str) -> None:
    if model_name == "shipped" and file_sha256(DEFAULT_NPZ) != golden()["shipped_model_sha256"]:
        pytest.skip("the shipped model changed since the digests were recorded")
    job = jobs()[job_name]
    for spec_name, spec in SPECS.items():
        recorded = outcomes(golden(), model_name, f"{job_name} / {spec_name}")
        table = compile_table(model(model_name), job, NCCLTuningPolicySpec.model_validate(spec))
        got = digest(table)
        assert got in [o["table"] for o in recorded], spec_name
        want = next(o for o in recorded if o["table"] == got)
        assert len(table.cells) == want["cells"], spec_name
        assert digest(assign(table, None, "job-a").table) == want["assigned_fresh"], spec_name
        covered = assign(table, coverage_of(table), "job-b", 5000).table
        assert digest(covered) == want["assigned_covered"], spec_name


def test_the_recorded_cases_exercise_departures_and_exploration() -> None:
    """The fixtures are not trivial: tables with many cells departing from NCCL's pick
    (static mode keeps only those) and learned tables with a cell per coordinate."""
    cases = golden()["models"]
    static = [v["cells"] for m in cases.values() for k, v in m.items() if k.endswith("/ static")]
    assert max(static) > 400
    assert sum(c > 0 for c in static) >= 12
    learned = cases["random-a"]["3d tp4 cp2 pp4 dp8 on 32x8 / learned"]["cells"]
    assert learned == 7 * 5 * 33

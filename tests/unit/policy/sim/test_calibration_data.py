"""The packaged calibration set keeps every row and its citation."""

from __future__ import annotations

import pytest

from dynamiccl.policy.sim.calibration_data import calibration_system, load_rows, load_system_specs
from dynamiccl.policy.sim.physics import Harness


def test_rows_load_with_citations() -> None:
    rows = load_rows()
    assert len(rows) >= 40
    assert all(r.source for r in rows)
    assert len({r.id for r in rows}) == len(rows)
    systems = load_system_specs()
    assert {r.system for r in rows} <= set(systems)


def test_busbw_rows_convert_to_time_as_nccl_tests_does() -> None:
    row = next(r for r in load_rows() if r.id == "h200-ar-16g")
    ranks = calibration_system(row.system).ranks
    t = row.measured_time_us(ranks)
    assert row.nbytes * 2 * (ranks - 1) / ranks / (t * 1e3) == pytest.approx(row.value)


def test_harness_from_the_citation() -> None:
    by_id = {r.id: r for r in load_rows()}
    assert by_id["ndmv4-1n-ar-1k"].harness is Harness.NCCL_TESTS_GRAPH
    assert by_id["h200-ar-32k"].harness is Harness.TORCH
    assert by_id["p5-2n-ar-8"].harness is Harness.NCCL_TESTS

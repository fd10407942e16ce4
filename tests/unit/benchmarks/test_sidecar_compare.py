"""`sidecar_bench --compare`'s per-record figure: a window that read no record is an error
that says so (it printed ~1.5e13 us per record: the CPU divided by 1e-9)."""

from __future__ import annotations

import pytest

from tests.unit.benchmarks.bench_module import bench_module

compare = bench_module("sidecar_compare")


def test_cpu_per_record_read() -> None:
    row = {"rate": 2000.0, "cpu_core_fraction": 0.05, "records_per_s_read": 2000.0}
    assert compare.per_record_us(row) == pytest.approx(25.0)


def test_a_window_that_read_nothing_is_an_error_not_a_figure() -> None:
    row = {"rate": 2000.0, "cpu_core_fraction": 0.05, "records_per_s_read": 0.0}
    with pytest.raises(compare.NoRecordsReadError, match="read no record"):
        compare.per_record_us(row)

"""The Nelder-Mead minimiser and the box transform."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.policy.sim.fit import from_box, nelder_mead, to_box


def test_box_transform_round_trips_and_respects_bounds() -> None:
    lo, hi = np.array([0.0, -5.0]), np.array([1.0, 5.0])
    x = np.array([0.25, 3.0])
    assert to_box(from_box(x, lo, hi), lo, hi) == pytest.approx(x)
    extreme = to_box(np.array([1e3, -1e3]), lo, hi)
    assert lo[0] <= extreme[0] <= hi[0]
    assert lo[1] <= extreme[1] <= hi[1]


def test_minimises_a_rosenbrock_valley_deterministically() -> None:
    def rosen(x: np.ndarray) -> float:
        return float(100 * (x[1] - x[0] ** 2) ** 2 + (1 - x[0]) ** 2)

    x1, f1 = nelder_mead(rosen, [-1.2, 1.0], max_evals=4000)
    x2, f2 = nelder_mead(rosen, [-1.2, 1.0], max_evals=4000)
    assert f1 < 1e-8
    assert x1 == pytest.approx([1.0, 1.0], abs=1e-3)
    assert np.array_equal(x1, x2)
    assert f1 == f2

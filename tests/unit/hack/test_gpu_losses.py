"""hack/gpu_losses.py: NCCL's pick against the fastest forced point, and the noise test."""

from __future__ import annotations

import math
from typing import Any

from dynamiccl.testing import scripts

gpu_losses = scripts.load("gpu_losses")


def _p(algo: str, mean: float, sd: float = 1.0, n: int = 20, nbytes: int = 4096) -> Any:
    return gpu_losses.Point("allreduce", nbytes, algo, "simple", 2, mean, sd, n)


def test_nccl_fastest_is_no_loss() -> None:
    assert gpu_losses.losses([_p("ring", 11.0), _p("tree", 12.0)], [_p("ring", 10.0)]) == []


def test_loss_with_saving_and_significance() -> None:
    nccl = [_p("ring", 100.0, sd=2.0), _p("ring", 50.0, nbytes=1 << 20)]
    forced = [
        _p("tree", 80.0, sd=2.0),
        _p("pat", 90.0),
        _p("tree", 49.9, sd=5.0, n=3, nbytes=1 << 20),
    ]
    out = gpu_losses.losses(forced, nccl)
    assert [(x.nbytes, x.best.algo) for x in out] == [(4096, "tree"), (1 << 20, "tree")]
    big = out[0]
    assert math.isclose(big.saving, 0.2)
    # 20 / sqrt(4/20 + 4/20) = 31.6 standard errors: outside the noise
    assert math.isclose(big.z, 20 / math.sqrt(0.4))
    assert big.significant
    small = out[1]
    assert math.isclose(small.saving, 0.1 / 50)
    assert not small.significant  # 0.1 us against sd 5 over 3 iterations and sd 1 over 20


def test_cells_without_forced_points_are_skipped_and_zero_noise_counts() -> None:
    assert gpu_losses.losses([], [_p("ring", 10.0)]) == []
    out = gpu_losses.losses([_p("tree", 9.0, sd=0.0)], [_p("ring", 10.0, sd=0.0)])
    assert out[0].z == math.inf
    assert out[0].significant

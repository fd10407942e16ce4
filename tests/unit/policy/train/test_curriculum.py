"""Curriculum jobs: valid, seeded, staged."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.api.features import Tier
from dynamiccl.policy.runtime.encode import JobContext
from dynamiccl.policy.train.curriculum import (
    MAX_LOG2,
    MIN_LOG2,
    Stage,
    sample_job,
    sample_jobs,
    stage_mix,
)


@pytest.mark.parametrize("stage", list(Stage))
def test_jobs_are_valid_and_staged(stage: Stage) -> None:
    rng = np.random.default_rng(3)
    for _ in range(60):
        job = sample_job(rng, stage)
        ctx = JobContext.of(job.features)  # resolvable: known GPU, consistent spec
        nodes = job.features.topology.nodes
        if stage is Stage.NODE:
            assert nodes == 1
            assert job.features.topology.tier_max is Tier.SAME_NODE
        elif stage is Stage.RACK:
            assert 2 <= nodes <= 16
        else:
            assert nodes >= 16
            assert job.features.topology.tier_max in (Tier.CROSS_RACK, Tier.CROSS_ZONE)
        assert ctx.system.ranks == job.features.world_size
        assert 2 <= len(job.streams) <= 4
        for _coll, n in job.streams:
            assert 2**MIN_LOG2 <= n <= 2**MAX_LOG2


def test_same_seed_same_jobs() -> None:
    a = sample_jobs(np.random.default_rng(5), 20, [1.0, 1.0, 1.0])
    b = sample_jobs(np.random.default_rng(5), 20, [1.0, 1.0, 1.0])
    assert a == b
    c = sample_jobs(np.random.default_rng(6), 20, [1.0, 1.0, 1.0])
    assert a != c


def test_stage_mix_rehearses_earlier_stages() -> None:
    assert stage_mix(0) == [1.0, 0.0, 0.0]
    for k in (1, 2):
        mix = stage_mix(k)
        assert abs(sum(mix) - 1.0) < 1e-9
        assert mix[0] > 0
        assert mix[k] == max(mix)


def test_the_mix_covers_what_the_suite_needs() -> None:
    jobs = sample_jobs(np.random.default_rng(0), 400, [1.0, 1.0, 1.0])
    specs = [j.features.topology for j in jobs]
    assert any(s.nvls for s in specs)
    assert any(s.intra.value == "pcie" for s in specs)
    assert {s.fabric.value for s in specs} >= {"infiniband", "roce", "efa"}
    assert any(s.sharp for s in specs)
    assert any(j.features.environment.container_boundary for j in jobs)

"""Observations: layout, determinism, NCCL's view, container boundaries."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.topology import parse_topology
from dynamiccl.policy.runtime.encode import (
    OBS_DIM,
    STATIC_DIM,
    JobContext,
    encode_calls,
    job_spec,
    nccl_view,
    static_vector,
)
from dynamiccl.policy.sim.nccl_model import NcclModel
from tests.topology_samples import dgx_h100

H100: dict[str, Any] = dgx_h100()


def test_layout_and_range() -> None:
    ctx = JobContext.of(parse_topology(H100))
    assert static_vector(ctx).shape == (STATIC_DIM,)
    nccl = NcclModel(ctx.system)
    coll = np.repeat(np.arange(5), 32)
    nbytes = np.tile(2.0 ** np.arange(3, 35), 5)
    obs, view = encode_calls(ctx, nccl, coll, nbytes)
    assert obs.shape == (160, OBS_DIM)
    assert np.isfinite(obs).all()
    assert obs.min() >= -1.0
    assert obs.max() <= 1.5
    again, _ = encode_calls(ctx, nccl, coll, nbytes)
    assert (obs == again).all()
    # NCCL's pick in the view is its cost model's pick.
    a, p, _ = nccl.pick(coll, nbytes)
    assert (view.pick_algo == a).all()
    assert (view.pick_proto == p).all()


def test_topologies_are_distinguished() -> None:
    a = static_vector(JobContext.of(parse_topology(H100)))
    b = static_vector(JobContext.of(parse_topology({**H100, "fabric": "efa"})))
    a100 = {**H100, "gpu": "A100", "nvls": False, "nvlink_GBps": 300}
    c = static_vector(JobContext.of(parse_topology(a100)))
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_nccl_view_relative_estimates() -> None:
    ctx = JobContext.of(parse_topology(H100))
    view = nccl_view(NcclModel(ctx.system), [4], [1 << 20])
    finite = view.rel[np.isfinite(view.rel)]
    assert finite.min() == 0.0  # the pick itself
    assert view.rel[0, view.pick_algo[0], view.pick_proto[0]] == 0.0
    assert (view.latency_us[np.isfinite(view.latency_us)] > 0).all()


def _features(container: bool) -> StateFeatures:
    per_pod = 4 if container else 8
    pods = 2 * (8 // per_pod)
    return StateFeatures.model_validate(
        {
            "world_size": pods * per_pod,
            "gpus_per_pod": per_pod,
            "replicas": pods,
            "nproc_per_node": per_pod,
            "topology": {
                **H100,
                "tier_max": "same_rack",
                "tier_mix": {"same_node": 0.1, "same_rack": 0.9},
            },
            "environment": {"container_boundary": container, "node_gpus": 8},
        }
    )


def test_container_boundary_becomes_container_gpus() -> None:
    split = job_spec(_features(True))
    assert (split.model_extra or {}).get("container_gpus") == 4
    whole = job_spec(_features(False))
    assert "container_gpus" not in (whole.model_extra or {})
    ctx = JobContext.of(_features(True))
    assert ctx.system.container_split
    assert not np.array_equal(static_vector(ctx), static_vector(JobContext.of(_features(False))))

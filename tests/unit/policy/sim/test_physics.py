"""The physical model: protocol ceilings, channel caps, chunking, monotonicity."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.sim.calibration import load_params
from dynamiccl.policy.sim.calibration_data import calibration_system
from dynamiccl.policy.sim.nccl_model import NcclModel
from dynamiccl.policy.sim.physics import Physics, SimParams, bus_factor

AR = Collective.ALLREDUCE.nccl_id
RING, NVLS = Algo.RING.nccl_id, Algo.NVLS.nccl_id
LL, LL128, SIMPLE = (p.nccl_id for p in Proto)


def physics(name: str, params: SimParams | None = None) -> Physics:
    return Physics(NcclModel(calibration_system(name)), params or load_params())


def test_bus_factor_follows_nccl_tests() -> None:
    f = bus_factor([c.nccl_id for c in Collective], 8)
    assert f.tolist() == pytest.approx([1.0, 1.0, 7 / 8, 7 / 8, 14 / 8])


def test_protocol_ceilings_ll_half_ll128_120_of_128() -> None:
    ph = physics("dgx-h200")
    ring = ph.tables.alg_bw[AR, RING]
    assert ring[LL] == pytest.approx(0.5 * ring[SIMPLE])
    assert ring[LL128] == pytest.approx(120 / 128 * ring[SIMPLE])


def test_nvls_efficiency_grows_with_the_team() -> None:
    etas = [physics(f"dgx-h200-{n}gpu").nvls_eta() for n in (5, 6, 7)]
    assert etas == sorted(etas)
    assert physics("dgx-h200").nvls_eta() > etas[-1]


def test_time_grows_with_size_for_every_available_configuration() -> None:
    # At a fixed channel count (NCCL's own channel tuning adds channels as messages
    # grow, so its default may show a small sawtooth, as real NCCL does).
    sizes = np.array([float(1 << k) for k in range(3, 35)])
    for name in ("dgx-h200", "aws-p5-2node", "azure-ndmv4-2node"):
        ph = physics(name)
        for c in range(5):
            for a in range(7):
                for p in range(3):
                    t = ph.times(np.full(sizes.shape, c), sizes, a, p, 8)
                    if np.isfinite(t).all():
                        assert np.all(np.diff(t) >= -1e-6), (name, c, a, p)
                    else:
                        assert not np.isfinite(t).any()


def test_one_channel_caps_large_transfers() -> None:
    ph = physics("dgx-h200")
    big = 1 << 30
    one, full = ph.times(AR, big, RING, SIMPLE, [1, 24])
    assert one > 5 * full


def test_nvls_chunk_follows_nccl_schedule() -> None:
    ph = physics("dgx-h200")  # 16 NVLS channels x 8 heads
    sizes = np.array([4 << 20, 16 << 20, 256 << 20, 2 << 30], dtype=np.float64)
    chunk = ph.default_chunk(np.full(4, NVLS), sizes, np.full(4, 16))
    assert chunk.tolist() == [16384, 32768, 65536, 131072]


def test_user_chunk_changes_only_simple() -> None:
    ph = physics("dgx-h200")
    ll = ph.times(AR, 1 << 20, RING, LL, 24, chunk=[0, 65536])
    assert ll[0] == ll[1]
    simple = ph.times(AR, 1 << 26, RING, SIMPLE, 24, chunk=[0, 32768])
    assert simple[1] > simple[0]


def test_unavailable_configuration_is_infinite() -> None:
    ph = physics("dgx-h200")
    assert np.isinf(ph.times(AR, 1 << 20, NVLS, LL, 16)).all()
    assert np.isinf(
        ph.times(Collective.BROADCAST.nccl_id, 1 << 20, Algo.TREE.nccl_id, SIMPLE, 8)
    ).all()


def test_launch_overhead_adds_up() -> None:
    ph = physics("dgx-h200")
    a, b = ph.times(AR, 8, RING, LL, 1, launch_us=[0.0, 10.0])
    assert b - a == pytest.approx(10.0)

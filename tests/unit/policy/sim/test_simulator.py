"""The simulator: anchoring to NCCL, grounded departures, noise, calibration fit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.sim.calibration_data import calibration_system, load_rows, load_system_specs
from dynamiccl.policy.sim.simulator import (
    Config,
    InfeasibleConfigError,
    NoiseModel,
    Simulator,
    busbw,
)
from dynamiccl.policy.sim.system import System, derive_spec, resolve

AR = Collective.ALLREDUCE
SIZES = [8, 4096, 1 << 16, 1 << 20, 16 << 20, 256 << 20, 4 << 30]


def synth(**over: Any) -> System:
    """The 8x H200 calibration node with some keys changed."""
    return resolve(derive_spec(load_system_specs()["dgx-h200"], **over))


UNDEPARTED = {
    "pcie-4": synth(gpu="L40S", intra="pcie", nvlink_GBps=0, nvls=False, gpus_per_node=4),
    "a100-1": calibration_system("azure-ndmv4-1node"),
    "a100-2": calibration_system("azure-ndmv4-2node"),
    "h100-4n-sharp": synth(nodes=4, sharp=True),
    "h100-16n-roce": synth(nodes=16, fabric="roce", nvls=False),
    "b200-2n": synth(gpu="B200", nvlink_GBps=900, nodes=2),
    "h200-4gpu": calibration_system("dgx-h200-4gpu"),
    "containers": synth(container_gpus=2, nodes=2),
    "pat": synth(gpus_per_node=1, nodes=8, nvls=False),
}


@pytest.mark.parametrize("name", sorted(UNDEPARTED))
def test_without_departures_nothing_beats_nccls_pick(name: str) -> None:
    sim = Simulator(UNDEPARTED[name])
    for coll in Collective:
        assert not sim.gap(coll, 1 << 20).departures
        for size in SIZES:
            g = sim.gap(coll, size)
            assert g.speedup == pytest.approx(1.0, abs=1e-12), (coll, size, g.best)


def test_nvls_beats_ring_on_5_gpus_as_measured() -> None:
    sim = Simulator(calibration_system("dgx-h200-5gpu"))
    g = sim.gap(AR, 8 << 30)
    assert g.nccl_default.algo is Algo.RING
    assert g.best.algo is Algo.NVLS
    rows = {r.id: r.value for r in load_rows()}
    measured = rows["h200x5-ar-8g-nvls"] / rows["h200x5-ar-8g-ring"]
    assert g.speedup == pytest.approx(measured, rel=0.05)
    assert [d.id for d in g.departures] == ["nvls-small-team"]


def test_no_nvls_gain_at_4_gpus() -> None:
    sim = Simulator(calibration_system("dgx-h200-4gpu"))
    assert sim.gap(AR, 8 << 30).speedup == pytest.approx(1.0)


def test_efa_64k_gain_is_at_least_what_the_rows_prove() -> None:
    sim = Simulator(calibration_system("aws-p5-2node"))
    g = sim.gap(AR, 1 << 16)
    assert g.nccl_default.proto is Proto.LL
    assert g.best.proto is not Proto.LL
    assert g.speedup >= 135.0 / 123.0 - 0.01  # rows p5-2n-ar-64k vs p5-2n-ar-1m


def test_channel_and_chunk_variants_never_beat_their_default() -> None:
    sim = Simulator(calibration_system("dgx-h200"))
    for size in SIZES:
        base = sim.times(AR.nccl_id, size, Algo.NVLS.nccl_id, Proto.SIMPLE.nccl_id)[0]
        var = sim.times(
            AR.nccl_id, size, Algo.NVLS.nccl_id, Proto.SIMPLE.nccl_id,
            nch=[4, 8, 12, 16, 24], chunk=[0, 65536, 1 << 20, 0, 32768],
        )  # fmt: skip
        assert (var >= base - 1e-9).all()


def test_default_prediction_is_nccls_pick_and_busbw_follows_nccl_tests() -> None:
    sim = Simulator(calibration_system("dgx-h200"))
    p = sim.predict(AR, 1 << 30)
    assert p.config.algo is Algo.NVLS
    assert p.config.nchannels == 16
    assert p.time_us == p.nccl_default_time_us
    assert p.busbw_GBps == pytest.approx((1 << 30) * 2 * 7 / 8 / (p.time_us * 1e3))
    assert busbw(Collective.BROADCAST, 1000, 1.0, 8) == pytest.approx(1.0)


def test_batch_equals_scalar() -> None:
    sim = Simulator(calibration_system("aws-p5-2node"))
    cfg = Config(Algo.RING, Proto.SIMPLE, 8)
    one = sim.predict(AR, 1 << 22, cfg).time_us
    batch = sim.times(
        AR.nccl_id, [1 << 20, 1 << 22], Algo.RING.nccl_id, Proto.SIMPLE.nccl_id, nch=8
    )
    assert batch[1] == pytest.approx(one)


def test_infeasible_configuration_says_why() -> None:
    sim = Simulator(calibration_system("azure-ndmv4-1node"))
    with pytest.raises(InfeasibleConfigError, match="NVLS needs"):
        sim.predict(AR, 1024, Config(Algo.NVLS, Proto.SIMPLE))
    with pytest.raises(InfeasibleConfigError, match="bytes"):
        sim.predict(AR, -1)


def test_noise_is_seeded_and_unbiased() -> None:
    sim = Simulator(calibration_system("azure-ndmv4-2node"), noise=NoiseModel(stddev=0.04))
    args = (
        np.full(4000, AR.nccl_id),
        np.full(4000, 1 << 24),
        Algo.RING.nccl_id,
        Proto.SIMPLE.nccl_id,
    )
    a = sim.sample(*args, seed=3)
    b = sim.sample(*args, seed=3)
    c = sim.sample(*args, seed=4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    mean = sim.times(*args)[0]
    assert np.mean(a) == pytest.approx(mean, rel=0.01)
    assert np.std(a) / mean == pytest.approx(0.04, rel=0.1)


def test_congestion_only_slows_down_multi_node() -> None:
    noise = NoiseModel(stddev=0.0, congestion_prob=0.5, congestion_max=0.5)
    multi = Simulator(calibration_system("azure-ndmv4-2node"), noise=noise)
    args = (
        np.full(1000, AR.nccl_id),
        np.full(1000, 1 << 24),
        Algo.RING.nccl_id,
        Proto.SIMPLE.nccl_id,
    )
    s = multi.sample(*args, seed=1) / multi.times(*args)
    assert s.min() >= 1.0 - 1e-12
    assert s.max() > 1.2
    assert (s > 1.0).mean() == pytest.approx(0.5, abs=0.08)
    single = Simulator(calibration_system("azure-ndmv4-1node"), noise=noise)
    assert np.allclose(single.sample(*args, seed=1), single.times(*args))


def test_container_boundary_costs_50_to_213_percent_latency() -> None:
    # Reference 004 (cross-Docker NCCL): +50..213 % latency; P2P/SHM lost.
    ws = {"gpu": "L40S", "intra": "pcie", "nvlink_GBps": 0, "nvls": False, "gpus_per_node": 4}
    ws |= {"nics_per_node": 0, "nic_Gbps": 0, "fabric": "none", "pcie_gen": 4}
    one = Simulator(synth(**ws))
    split = Simulator(synth(**ws, container_gpus=1))
    for coll in (AR, Collective.BROADCAST, Collective.ALLGATHER):
        penalty = split.predict(coll, 1024).time_us / one.predict(coll, 1024).time_us - 1
        assert 0.5 <= penalty <= 2.13, (coll, penalty)

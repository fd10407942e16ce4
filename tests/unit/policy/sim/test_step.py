"""The step model: compute overlapped with NCCL channels that take SMs (policy/sim/step.py).

The all-reduce times come from the product's simulator (8x H200, tree / LL128, one
25 MiB DDP bucket): 8 channels 575 us, 32 channels 434 us (the simulator's
bandwidth saturates at 16 channels there).
"""

from __future__ import annotations

import pytest

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.policy.sim.calibration_data import calibration_system
from dynamiccl.policy.sim.hardware import CATALOG
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.policy.sim.step import (
    SM_COUNT,
    StepModelError,
    StepSpec,
    overlap_rate,
    simulate,
    sm_count,
    step_time,
)

BUCKET = 25 << 20
BUCKETS = 24  # a 1.3 B-parameter model's fp32 gradients in 25 MiB buckets
FEW, MANY = 8, 32


def bucket_us(nch: int) -> float:
    sim = Simulator(calibration_system("dgx-h200"))
    t = sim.times(
        Collective.ALLREDUCE.nccl_id, BUCKET, Algo.TREE.nccl_id, Proto.LL128.nccl_id, nch=nch
    )
    return float(t[0])


def test_overlap_bound_job_more_channels_faster_all_reduce_slower_step() -> None:
    few, many = bucket_us(FEW), bucket_us(MANY)
    assert many <= 0.9 * few  # the all-reduce is >= 10 % faster with more channels
    # 18 ms of compute, 75 % of it the backward pass that hides the buckets
    slow = step_time(18_000, BUCKETS * few, 0.75, FEW, gpu="H200")
    fast = step_time(18_000, BUCKETS * many, 0.75, MANY, gpu="H200")
    assert fast.step_us >= 1.05 * slow.step_us  # ... and the step >= 5 % slower
    # overlap-bound: every bucket but the last (ready when the backward pass ends) hidden,
    # and the step slower because the compute is slower
    assert fast.comm_end_us - fast.compute_end_us <= many + 1e-6
    assert fast.compute_end_us > slow.compute_end_us


def test_communication_bound_job_more_channels_faster_step() -> None:
    few, many = bucket_us(FEW), bucket_us(MANY)
    slow = step_time(4_000, BUCKETS * few, 0.6, FEW, gpu="H200")
    fast = step_time(4_000, BUCKETS * many, 0.6, MANY, gpu="H200")
    assert fast.comm_end_us > fast.compute_end_us  # the buckets outlast the compute
    assert fast.step_us <= 0.9 * slow.step_us  # both faster: the step follows the all-reduce


def test_each_channel_beyond_the_free_sms_slows_the_compute_proportionally() -> None:
    assert overlap_rate(132, 132, 8) == pytest.approx(124 / 132)
    assert overlap_rate(132, 100, 32) == 1.0  # 32 SMs free: nothing taken
    assert overlap_rate(132, 100, 40) == pytest.approx(92 / 100)
    assert overlap_rate(108, 108, 0) == 1.0


def test_without_channels_taken_the_step_is_the_longer_of_compute_and_hidden_comm() -> None:
    spec = StepSpec(pre_us=1000, overlap_us=4000, ready=(0.0,), post_us=500, compute_sms=100)
    assert simulate(spec, [3000], 32).step_us == pytest.approx(5500)  # hidden
    assert simulate(spec, [6000], 32).step_us == pytest.approx(7500)  # exposed: 1000+6000+500


def test_a_bucket_waits_for_its_gradients_and_slowed_compute_delays_it() -> None:
    spec = StepSpec(pre_us=0, overlap_us=1000, ready=(0.5, 1.0), sms=132, compute_sms=132)
    t = simulate(spec, [200, 10], 66)  # half the SMs taken while a bucket runs
    # bucket 1 at 500; compute at half rate for 200 us does 100; the rest 400 at full rate
    assert t.compute_end_us == pytest.approx(1100)
    assert t.comm_end_us == pytest.approx(1110)
    assert t.step_us == pytest.approx(1110)


def test_sm_counts_are_catalog_gpus() -> None:
    assert set(SM_COUNT) <= set(CATALOG)
    assert sm_count("H100") == 132
    assert sm_count("B200") == 148
    with pytest.raises(StepModelError, match="gpu"):
        sm_count("T4")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"overlap": 1.5}, "overlap"),
        ({"channels": 200}, "channels"),
        ({"compute_sms": 0}, "compute_sms"),
        ({"buckets": 0}, "buckets"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict[str, float], field: str) -> None:
    args: dict[str, float] = {"overlap": 0.5, "channels": 8} | kwargs
    with pytest.raises(StepModelError, match=field):
        step_time(1000, 500, args.pop("overlap"), int(args.pop("channels")), **args)  # type: ignore[arg-type]

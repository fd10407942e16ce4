"""Training jobs for the curriculum: single node -> rack -> multi-tier.

The reference material proposes learning the easy regime first (one node,
one interconnect) and widening to racks of nodes on one fabric and then to
multi-tier clusters. Each stage is a distribution over jobs: a topology drawn
from the GPU catalog and realistic fabrics, state features consistent with it
(tiers, container boundary, workload block), and the job's call streams
(collective, size). Everything is drawn from a numpy Generator: the same seed
gives the same jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import numpy as np

from dynamiccl.api.features import (
    Compression,
    EnvironmentFeatures,
    ParallelDegrees,
    Parallelism,
    StateFeatures,
    SyncMode,
    Tier,
    TierMix,
    TopologyFeatures,
    WorkloadFeatures,
)
from dynamiccl.api.nccl import Collective
from dynamiccl.api.topology import Fabric, Intra
from dynamiccl.policy.sim.hardware import CATALOG

MIN_LOG2: Final = 3  # 8 B
MAX_LOG2: Final = 34  # 16 GiB


class Stage(StrEnum):
    """Curriculum stages, in order."""

    NODE = "node"  # one node: NVSwitch / NVLink / PCIe, with and without NVLS
    RACK = "rack"  # 2-16 nodes under one leaf switch: IB, RoCE, EFA, Ethernet
    TIER = "tier"  # 16-128 nodes across racks and zones


STAGES: Final = tuple(Stage)

# GPUs datacenter training runs on get most of the weight; the rest keep the
# policy honest on PCIe-only and consumer parts.
_GPU_WEIGHTS: Final = {
    "H100": 4.0,
    "H200": 3.0,
    "A100": 3.0,
    "B200": 2.0,
    "H800": 1.0,
    "A800": 0.5,
    "GB200": 1.0,
    "GH200": 0.5,
    "H20": 0.5,
    "V100": 1.0,
    "L40S": 1.0,
    "L4": 0.5,
    "A10": 0.5,
    "T4": 0.3,
    "RTX3080": 0.3,
    "RTX3090": 0.3,
    "RTX4090": 0.3,
    "B100": 0.5,
}


@dataclass(frozen=True)
class Job:
    """One training job: its state features and the streams of calls it issues."""

    features: StateFeatures
    streams: tuple[tuple[Collective, int], ...]


def _pick(rng: np.random.Generator, items: list[str], weights: list[float]) -> str:
    w = np.asarray(weights, dtype=np.float64)
    return items[int(rng.choice(len(items), p=w / w.sum()))]


def _topology(rng: np.random.Generator, stage: Stage) -> dict[str, object]:
    names = [n for n in _GPU_WEIGHTS if n in CATALOG]
    gpu = CATALOG[_pick(rng, names, [_GPU_WEIGHTS[n] for n in names])]
    nvlink = gpu.nvlink_links > 0
    if nvlink and rng.random() < 0.85:
        intra = Intra.NVSWITCH if gpu.nvlink_links >= 8 else Intra.NVLINK
    else:
        intra = Intra.PCIE
    if intra is Intra.NVSWITCH:
        gpn = int(rng.choice([2, 4, 5, 6, 7, 8, 8, 8, 8]))
    elif intra is Intra.NVLINK:
        gpn = int(rng.choice([2, 4]))
    else:
        gpn = (
            int(rng.choice([1, 2, 4, 8])) if stage is not Stage.NODE else int(rng.choice([2, 4, 8]))
        )
    nvls = intra is Intra.NVSWITCH and gpu.nvls_capable and rng.random() < 0.8
    if stage is Stage.NODE:
        nodes = 1
    elif stage is Stage.RACK:
        nodes = int(rng.choice([2, 2, 3, 4, 4, 8, 16]))
    else:
        nodes = int(rng.choice([16, 32, 64, 128]))
    if nodes == 1 and rng.random() < 0.5:
        fabric, nics, nic = Fabric.NONE, 0, 0.0
    else:
        fabric = Fabric(
            _pick(rng, ["infiniband", "roce", "efa", "ethernet"], [0.45, 0.25, 0.2, 0.1])
        )
        if fabric is Fabric.EFA:
            nics = int(rng.choice([4, 8, 16, 32]))
            nic = float(rng.choice([100.0, 200.0]))
        else:
            nics = int(rng.choice([1, 2, 4, 8, 8]))
            nic = float(rng.choice([100.0, 200.0, 400.0]))
    sharp = fabric is Fabric.INFINIBAND and nodes > 1 and rng.random() < 0.3
    out: dict[str, object] = {
        "name": f"{stage.value}-{gpu.name.lower()}",
        "gpu": gpu.name,
        "gpus_per_node": gpn,
        "nodes": nodes,
        "intra": intra.value,
        "nvlink_GBps": gpu.nvlink_GBps if intra is not Intra.PCIE else 0.0,
        "nvls": nvls,
        "pcie_gen": gpu.pcie_gen,
        "nics_per_node": nics,
        "nic_Gbps": nic,
        "fabric": fabric.value,
        "sharp": sharp,
    }
    return out


def _tiers(rng: np.random.Generator, stage: Stage, nodes: int) -> tuple[Tier, TierMix]:
    if nodes == 1:
        return Tier.SAME_NODE, TierMix()
    if stage is Stage.RACK:
        local = float(rng.uniform(0.02, 0.2))
        return Tier.SAME_RACK, TierMix(same_node=local, same_rack=1 - local)
    zone = rng.random() < 0.3
    parts = rng.dirichlet([1.0, 2.0, 4.0, 1.0 if zone else 1e-9])
    if not zone:
        parts[3] = 0.0
        parts /= parts.sum()
    mix = TierMix(
        same_node=float(parts[0]),
        same_rack=float(parts[1]),
        cross_rack=float(parts[2]),
        cross_zone=float(1.0 - parts[0] - parts[1] - parts[2]) if zone else 0.0,
    )
    return (Tier.CROSS_ZONE if zone else Tier.CROSS_RACK), mix


def _workload(rng: np.random.Generator, world: int) -> WorkloadFeatures:
    par = Parallelism(_pick(rng, [p.value for p in Parallelism], [4, 2, 1, 3, 2, 1]))
    tp = int(rng.choice([1, 2, 4, 8])) if par in (Parallelism.TP, Parallelism.THREE_D) else 1
    pp = int(rng.choice([1, 2, 4])) if par in (Parallelism.PP, Parallelism.THREE_D) else 1
    dp = max(1, world // (tp * pp))
    ep = int(rng.choice([1, 2, 4, 8])) if par is Parallelism.MOE else 1
    comp = Compression(_pick(rng, [c.value for c in Compression], [6, 2, 2, 1, 1, 0.5, 0.5, 0.5]))
    ratio = {"none": 1.0, "fp16": 0.5, "bf16": 0.5, "fp8": 0.25, "int8": 0.25}.get(
        comp.value, float(rng.uniform(0.01, 0.1))
    )
    sync = SyncMode(_pick(rng, [s.value for s in SyncMode], [8, 1, 0.5, 1]))
    return WorkloadFeatures(
        parallelism=par,
        degrees=ParallelDegrees(dp=min(dp, 1_000_000), tp=tp, pp=pp, ep=ep),
        sync_mode=sync,
        local_steps=int(rng.integers(2, 64)) if sync is SyncMode.LOCAL_SGD else 0,
        compression=comp,
        compression_ratio=ratio,
        model_params=float(10 ** rng.uniform(7, 11.5)) if rng.random() < 0.8 else 0.0,
        c2c_ratio=float(rng.lognormal(0.0, 1.0)) if rng.random() < 0.5 else None,
    )


def _streams(rng: np.random.Generator, par: Parallelism) -> tuple[tuple[Collective, int], ...]:
    """The (collective, size) call streams a job of this parallelism issues."""
    typical = {
        Parallelism.DP: [Collective.ALLREDUCE],
        Parallelism.FSDP: [Collective.ALLGATHER, Collective.REDUCESCATTER],
        Parallelism.TP: [Collective.ALLREDUCE, Collective.ALLGATHER],
        Parallelism.PP: [Collective.BROADCAST, Collective.REDUCE, Collective.ALLREDUCE],
        Parallelism.THREE_D: [Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER],
        Parallelism.MOE: [Collective.ALLGATHER, Collective.ALLREDUCE],
    }[par]
    n = int(rng.integers(2, 5))
    out = []
    for _ in range(n):
        coll = (
            typical[int(rng.integers(len(typical)))]
            if rng.random() < 0.6
            else Collective(list(Collective)[int(rng.integers(len(Collective)))])
        )
        size = round(2.0 ** rng.uniform(MIN_LOG2, MAX_LOG2))
        out.append((coll, size))
    return tuple(out)


def sample_job(rng: np.random.Generator, stage: Stage) -> Job:
    """One job of a curriculum stage (valid state features, resolvable topology)."""
    topo = _topology(rng, stage)
    gpn = int(topo["gpus_per_node"])  # type: ignore[call-overload]
    nodes = int(topo["nodes"])  # type: ignore[call-overload]
    per_pod = gpn
    if stage is not Stage.NODE and gpn >= 2 and rng.random() < 0.15:
        per_pod = int(rng.choice([d for d in (1, 2, 4) if d < gpn and gpn % d == 0]))
    pods = nodes * (gpn // per_pod)
    tier_max, mix = _tiers(rng, stage, nodes)
    if per_pod < gpn and nodes == 1:
        tier_max, mix = Tier.SAME_NODE, TierMix()
    topology = TopologyFeatures.model_validate(
        {**topo, "tier_max": tier_max, "tier_mix": mix, "ina_active": False}
    )
    world = pods * per_pod
    features = StateFeatures(
        world_size=world,
        gpus_per_pod=per_pod,
        replicas=pods,
        nproc_per_node=per_pod,
        scheduled=True,
        topology=topology,
        workload=_workload(rng, world),
        environment=EnvironmentFeatures(
            container_boundary=per_pod < gpn, node_gpus=gpn, pods_per_node_max=gpn // per_pod
        ),
    )
    return Job(features=features, streams=_streams(rng, features.workload.parallelism))


def stage_mix(stage_index: int) -> list[float]:
    """Probability of each stage while training stage `stage_index` (earlier ones rehearsed)."""
    if stage_index <= 0:
        return [1.0, 0.0, 0.0]
    if stage_index == 1:
        return [0.3, 0.7, 0.0]
    return [0.2, 0.3, 0.5]


def sample_jobs(rng: np.random.Generator, n: int, mix: list[float]) -> list[Job]:
    """`n` jobs with stages drawn from `mix`."""
    p = np.asarray(mix, dtype=np.float64)
    return [sample_job(rng, STAGES[int(rng.choice(len(STAGES), p=p / p.sum()))]) for _ in range(n)]

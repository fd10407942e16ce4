"""What the demo's training job asks of NCCL, and what each configuration costs (simulated).

The job's ranks issue the same collectives every training step (`STEP`); a
rank process plays NCCL for each of them against the real plugin. Everything a
rank needs to know about time is computed here, once, from the calibrated
simulator (`dynamiccl.policy.sim.simulator`) and handed to the ranks as a
`TimeTable` file, so rank processes import neither numpy nor the simulator:

- `cost`: NCCL's own cost table for each call (`float[7][3]`, -1.0 where NCCL
  marks the (algorithm, protocol) unavailable): what NCCL passes the tuner;
- `nccl_channels`: NCCL's channel count for an (algorithm, protocol) when the
  plugin leaves `nChannels` at 0;
- `mean_us`: the simulated mean time of every configuration the plugin could
  force (every available (algorithm, protocol) x the policy's channel options x
  its chunk options for Simple);
- `nccl_default_us`: the simulated mean time of NCCL's own pick — the baseline
  the demo compares against.

Measured times are `mean_us` x a mean-preserving lognormal jitter (3 %, as the
simulator's noise model) drawn from a seed shared by all ranks, so every rank
of the communicator sees the same time for the same call, as on real GPUs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict

from dynamiccl.api.nccl import Collective, Proto
from dynamiccl.api.table import size_bucket
from dynamiccl.api.topology import TopologySpec

IGNORE: Final = -1.0
JITTER: Final = 0.03


@dataclass(frozen=True)
class Op:
    """One collective of a training step, issued `repeat` times per step."""

    collective: Collective
    nbytes: int  # as NCCL passes it to the tuner (all-gather: the whole gathered buffer)
    repeat: int
    what: str


# A step of a small data-parallel (FSDP) job on 16 ranks. Sizes are multiples of 16 ranks x
# 4 bytes so every rank's share is whole. Where the simulator says NCCL's own pick is right
# (the 32 MiB bucket), DynamICCL must not lose; where it says NCCL's model is off for this
# fabric (EFA's LL, docs/simulator.md `efa-ll`), it can win.
STEP: Final = (
    Op(Collective.ALLREDUCE, 6 * 1024, 1, "loss and gradient-norm statistics"),
    Op(Collective.ALLGATHER, 720 * 1024, 2, "parameter shards of two FSDP units"),
    Op(Collective.REDUCESCATTER, 720 * 1024, 2, "gradient shards of two FSDP units"),
    Op(Collective.ALLREDUCE, 160 * 1024, 1, "replicated norm and bias gradients"),
    Op(Collective.ALLREDUCE, 32 << 20, 1, "one large gradient bucket"),
)


def calls_per_step(step: tuple[Op, ...] = STEP) -> int:
    """Collective calls one rank issues per training step."""
    return sum(op.repeat for op in step)


def cfg_key(coll: int, nbytes: int, algo: int, proto: int, nch: int, chunk: int) -> str:  # noqa: PLR0917
    """Key of one configuration of one call in `TimeTable.mean_us`."""
    return f"{coll}:{nbytes}:{algo}:{proto}:{nch}:{chunk}"


def call_key(coll: int, nbytes: int) -> str:
    """Key of one call in `TimeTable.cost` / `nccl_default_us`."""
    return f"{coll}:{nbytes}"


class TimeTable(BaseModel):
    """Simulated times of every configuration of every call of the step (see module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topology: str
    nranks: int
    nnodes: int
    cost: dict[str, list[list[float]]]
    nccl_channels: dict[str, int]  # "coll:nbytes:algo:proto" -> channels
    nccl_default_us: dict[str, float]
    nccl_default: dict[str, tuple[int, int, int]]  # NCCL's (algo, proto, channels)
    mean_us: dict[str, float]

    def time_us(  # noqa: PLR0917 - the key's coordinates
        self, coll: int, nbytes: int, algo: int, proto: int, nch: int, chunk: int
    ) -> float | None:
        """Mean time of a configuration; `nch`/`chunk` 0 = NCCL's own; None if not tabulated."""
        exact = self.mean_us.get(cfg_key(coll, nbytes, algo, proto, nch, chunk))
        if exact is not None:
            return exact
        own = self.nccl_channels.get(f"{coll}:{nbytes}:{algo}:{proto}")
        if own is not None and nch == own:  # NCCL's own count, named explicitly
            return self.mean_us.get(cfg_key(coll, nbytes, algo, proto, 0, chunk))
        return None

    def write(self, path: Path) -> None:
        """Write as JSON (atomic rename)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json())
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> TimeTable:
        """Read a table written by `write`."""
        return cls.model_validate_json(path.read_text())


def build_time_table(spec: TopologySpec, step: tuple[Op, ...] = STEP) -> TimeTable:
    """Tabulate the step's calls on a topology with the calibrated simulator."""
    import numpy as np  # noqa: PLC0415 - keep rank processes free of numpy

    from dynamiccl.policy.runtime.actions import action_mask  # noqa: PLC0415
    from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS  # noqa: PLC0415
    from dynamiccl.policy.sim.simulator import Simulator  # noqa: PLC0415

    sim = Simulator(spec)
    cost: dict[str, list[list[float]]] = {}
    nccl_ch: dict[str, int] = {}
    default_us: dict[str, float] = {}
    default: dict[str, tuple[int, int, int]] = {}
    rows: list[tuple[int, int, int, int, int, int]] = []
    for op in step:
        c, n = op.collective.nccl_id, op.nbytes
        est = sim.nccl.times([c], [n])[0]
        mask = action_mask(sim.system, op.collective)
        table = [
            [
                float(est[a, p]) if mask[a, p] and math.isfinite(est[a, p]) else IGNORE
                for p in range(3)
            ]
            for a in range(7)
        ]
        cost[call_key(c, n)] = table
        cfg, t, _ = sim.nccl_default(op.collective, n)
        default_us[call_key(c, n)] = t
        default[call_key(c, n)] = (cfg.algo.nccl_id, cfg.proto.nccl_id, int(cfg.nchannels or 0))
        for a in range(7):
            for p in range(3):
                if table[a][p] == IGNORE:
                    continue
                own = int(sim.nccl.channels([a], [p], [n])[0])
                nccl_ch[f"{c}:{n}:{a}:{p}"] = own
                chunks = CHUNK_OPTIONS if p == Proto.SIMPLE.nccl_id else (0,)
                rows += [(c, n, a, p, k, ck) for k in CHANNEL_OPTIONS for ck in chunks]
    arr = np.array(rows, dtype=np.int64)
    times = sim.times(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], nch=arr[:, 4], chunk=arr[:, 5])
    mean = {
        cfg_key(*map(int, r)): float(t)
        for r, t in zip(rows, times.tolist(), strict=True)
        if math.isfinite(t)
    }
    return TimeTable(
        topology=spec.name,
        nranks=sim.system.ranks,
        nnodes=spec.nodes,
        cost=cost,
        nccl_channels=nccl_ch,
        nccl_default_us=default_us,
        nccl_default=default,
        mean_us=mean,
    )


class Jitter:
    """Mean-preserving lognormal jitter; the same seed gives the same sequence on every rank."""

    def __init__(self, seed: int, sigma: float = JITTER) -> None:
        self._rng = random.Random(seed)
        self._sigma = sigma

    def __call__(self) -> float:
        s = self._sigma
        return math.exp(self._rng.gauss(0.0, s) - s * s / 2)


def step_buckets(step: tuple[Op, ...] = STEP) -> list[tuple[Collective, int]]:
    """The (collective, size bucket) cells the step touches, in step order, unique."""
    out: list[tuple[Collective, int]] = []
    for op in step:
        key = (op.collective, size_bucket(op.nbytes))
        if key not in out:
            out.append(key)
    return out


def describe(step: tuple[Op, ...] = STEP) -> str:
    """One line per op, for the report."""
    return "\n".join(
        f"- {op.repeat} x {op.collective.value} of {op.nbytes} bytes: {op.what}" for op in step
    )

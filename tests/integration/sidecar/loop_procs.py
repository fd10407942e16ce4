"""A training rank of the learning-loop test: python loop_procs.py JSON-ARGS.

Loads the real plugin (.so) through the harness, waits for its pod's shared
memory file (the native sidecar creates it before the training container
starts), then plays one world communicator's collective sequence: the same on
every rank (seeded), tuned by the plugin, timed by the simulator for the
configuration the plugin made NCCL choose (NCCL's cost table is the policy's
re-implementation of NCCL's model), profiled with GPU timestamps. Writes its
decision log (algo, proto, channels per call) and a stats JSON.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path

from dynamiccl.api.topology import TopologySpec
from dynamiccl.policy.sim.simulator import Simulator
from dynamiccl.testing.nccl_player import Comm, Plugin, ProfiledComm, default_so, play

WORLD_COMM = 0x5EED_0001
SIZES = ((4, 1 << 16), (4, 1 << 20), (4, 16 << 20), (4, 64 << 20), (2, 1 << 20), (3, 16 << 20))


def sequence(seed: int, n: int) -> list[tuple[int, int]]:
    """The collective sequence every rank issues (all-reduce heavy, like data parallelism)."""
    rng = random.Random(seed)
    weights = (3, 3, 3, 2, 1, 1)
    return [rng.choices(SIZES, weights)[0] for _ in range(n)]


def main(a: dict[str, object]) -> None:
    shm = Path(str(a["shm"]))
    deadline = time.monotonic() + 120
    while not shm.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.environ["DYNAMICCL_SHM_PATH"] = str(shm)

    sim = Simulator(TopologySpec.model_validate(a["topology"]))
    nranks, nnodes = sim.system.ranks, sim.system.nodes
    plugin = Plugin(default_so())
    rank = int(str(a["rank"]))
    comm = Comm(plugin, 6, nranks, nnodes, comm_id=WORLD_COMM)
    prof = ProfiledComm(plugin, 5, nranks, nnodes, comm_id=WORLD_COMM, rank=rank)
    costs: dict[tuple[int, int], list[list[float]]] = {}
    times: dict[tuple[int, int, int, int, int], float] = {}

    def cost(c: int, nbytes: int) -> list[list[float]]:
        if (c, nbytes) not in costs:
            t = sim.nccl.times([c], [nbytes])[0]
            costs[(c, nbytes)] = [
                [float(v) if math.isfinite(v) else -1.0 for v in row] for row in t
            ]
        return costs[(c, nbytes)]

    jitter = random.Random(int(str(a["seed"])))  # the same draws on every rank

    def time_fn(c: int, nbytes: int, algo: int, proto: int, nch: int) -> float:
        key = (c, nbytes, algo, proto, nch)
        if key not in times:
            times[key] = float(sim.times(c, nbytes, algo, proto, nch=nch)[0])
        return times[key] * jitter.lognormvariate(0.0, 0.03)

    calls = sequence(int(str(a["seed"])), int(str(a["n"])))
    pace, chunk = float(str(a["pace"])), 10
    log = bytearray()
    t0 = time.monotonic()
    for i in range(0, len(calls), chunk):
        for p in play(comm, calls[i : i + chunk], time_fn, profiler=prof, cost_fn=cost):
            log += bytes((p.algo & 0xFF, p.proto & 0xFF, p.nchannels & 0xFF))
        time.sleep(pace)  # a training step's compute between collectives
    out = Path(str(a["out"]))
    (out / f"decisions-{rank}.bin").write_bytes(bytes(log))
    stats = {
        "rank": rank,
        "played": len(calls),
        "seconds": time.monotonic() - t0,
        "waits": sum("waits for the outcome" in m for _, m in plugin.logs),
        "logs": [m for _, m in plugin.logs][:20],
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(stats))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

"""Processes of the agreement test: `worker` (a rank), `sidecar` (a pod's voter), `coordinator`.

Run as a script: python agreement_procs.py ROLE JSON-ARGS
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    scale_class,
    size_bucket,
)
from dynamiccl.sidecar.cas import FileCAS
from dynamiccl.sidecar.participant import Participant
from dynamiccl.sidecar.proposer import Coordinator, DirTableStore
from dynamiccl.sidecar.shm import ShmFile
from dynamiccl.testing.nccl_player import Comm, Plugin, realistic_cost_table

WORLD = (32, 4)  # nranks, nnodes
POD = (8, 1)
SIZES = (256, 4096, 65536, 1 << 20, 1 << 24)
COLLS = (4, 2, 3, 0)


def sequence(seed: int, n: int) -> list[tuple[int, int]]:
    """The collective sequence every rank of a communicator issues."""
    rng = random.Random(seed)
    return [(rng.choice(COLLS), rng.choice(SIZES)) for _ in range(n)]


def make_table(version: int) -> DecisionTable:
    """Version-specific channel counts make every decision show which table was in effect."""
    cells = []
    protos = (Proto.LL, Proto.LL128, Proto.SIMPLE)
    for shape in (WORLD, POD):
        sc = scale_class(*shape)
        for coll in COLLS:
            for size in SIZES:
                cands = (
                    Candidate(algo=Algo.RING, proto=Proto.LL, nchannels=100 + version, weight=2),
                    Candidate(algo=Algo.TREE, proto=Proto.SIMPLE, nchannels=150 + version),
                )
                cells.append(
                    Cell(
                        collective=Collective(list(Collective)[coll]),
                        bucket=size_bucket(size),
                        scale=sc,
                        choices=(
                            Choice(algo=Algo.NVLS, proto=Proto.SIMPLE, nchannels=version),
                            Choice(algo=Algo.RING, proto=protos[version % 3], nchannels=version),
                        ),
                        candidates=cands,
                        explore=0.2,
                    )
                )
    return DecisionTable(
        version=version,
        scales=(scale_class(*WORLD), scale_class(*POD)),
        cells=tuple(cells),
        explore=ExploreSchedule(seed=77, half_life_log2=10),
    )


def worker(a: dict[str, object]) -> None:
    os.environ["DYNAMICCL_SHM_PATH"] = str(a["shm"])
    rank, pod = int(str(a["rank"])), int(str(a["pod"]))
    n_world, n_pod = int(str(a["n_world"])), int(str(a["n_pod"]))
    plugin = Plugin(Path(str(a["so"])))
    world = Comm(plugin, 5, *WORLD, comm_id=0xC0FFEE)
    podc = Comm(plugin, 6, *POD, comm_id=0xB0D0 + pod)
    costs = {
        (c, n, s): realistic_cost_table(c, n, *s, nvls=(s == POD))
        for c in COLLS
        for n in SIZES
        for s in (WORLD, POD)
    }
    seq_w, seq_p = sequence(1, n_world), sequence(100 + pod, n_pod)
    log_w, log_p = bytearray(), bytearray()
    rng = random.Random(1000 + rank)
    pace = float(str(a["pace"]))
    t0 = time.monotonic()
    for i in range(max(n_world, n_pod)):
        if i < n_world:
            c, n = seq_w[i]
            r = world.get_coll_info(c, n, costs[(c, n, WORLD)])
            log_w += bytes((r.algo & 0xFF, r.proto & 0xFF, r.nchannels & 0xFF))
        if i < n_pod:
            c, n = seq_p[i]
            r = podc.get_coll_info(c, n, costs[(c, n, POD)])
            log_p += bytes((r.algo & 0xFF, r.proto & 0xFF, r.nchannels & 0xFF))
        if i % 10 == 9:
            time.sleep(pace)  # a training step's compute between collectives
        if rng.random() < 0.004:
            time.sleep(rng.random() * (0.05 if rng.random() < 0.1 else 0.005))
    out = Path(str(a["out"]))
    (out / f"world-{rank}.bin").write_bytes(bytes(log_w))
    (out / f"pod{pod}-{rank}.bin").write_bytes(bytes(log_p))
    waits = sum("waits for the outcome" in m for _, m in plugin.logs)
    stats = {
        "rank": rank,
        "seconds": time.monotonic() - t0,
        "calls": n_world + n_pod,
        "waits": waits,
    }
    (out / f"done-{rank}.json").write_text(json.dumps(stats))


def sidecar(a: dict[str, object]) -> None:
    shm = ShmFile(Path(str(a["shm"])))
    p = Participant(
        FileCAS(Path(str(a["store"]))),
        DirTableStore(Path(str(a["tables"]))),
        shm,
        str(a["voter"]),
        expected_procs=int(str(a["procs"])),
        abort_after_s=1.0,
    )
    stop = Path(str(a["stop"]))
    drained = 0
    while not stop.exists():
        p.step()
        for proc in shm.procs():
            drained += len(shm.drain(proc.index))
        time.sleep(0.003)


def coordinator(a: dict[str, object]) -> None:
    store = FileCAS(Path(str(a["store"])))
    coord = Coordinator(store, DirTableStore(Path(str(a["tables"]))), lead=8)
    stop = Path(str(a["stop"]))
    first, last = int(str(a["first"])), int(str(a["last"]))
    version = first
    next_at = time.monotonic() + 0.5
    rng = random.Random(first)
    while not stop.exists() and version <= last:
        coord.step()
        # a short lead puts K right where the fastest ranks are: races at the boundary
        coord.lead = rng.choice((1, 1, 2, 8))
        if time.monotonic() >= next_at and coord.publish(make_table(version)) is not None:
            with Path(str(a["log"])).open("a") as f:
                f.write(f"proposed {version}\n")
            version += 1
            next_at = time.monotonic() + 0.4
        time.sleep(0.003)
    while not stop.exists():
        coord.step()
        time.sleep(0.003)


if __name__ == "__main__":
    role, args = sys.argv[1], json.loads(sys.argv[2])
    {"worker": worker, "sidecar": sidecar, "coordinator": coordinator}[role](args)

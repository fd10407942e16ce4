"""The sidecar bench's job and its plugin stand-in (benchmarks/sidecar_bench.py).

The job: one 8-rank communicator on one DGX H100 node, a learned table of 24
cells (4 collectives x 6 sizes) each with a choice and three exploration
candidates, exploration mode ``learned``. The feeder (`feed`) fills process
slot 0's profiler ring at a fixed rate exactly as the plugin does (body first,
then the sequence word; `head` claimed; a full ring drops and counts), mixing
the 24 cells with lognormal 3 % times; `register` writes the communicator's
registry entry as the plugin would.

Imported after sidecar_bench.py put the measured tree first on sys.path
(`--compare`): the shared-memory layout and record format are that tree's.
"""

from __future__ import annotations

import json
import os
import random
import struct
import time
from pathlib import Path

import numpy as np

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    scale_class,
)
from dynamiccl.sidecar import shm
from dynamiccl.sidecar.ring import RECORD_DTYPE

COMM = 0xB0B
NRANKS, NNODES = 8, 1
SIZES = tuple(1 << b for b in (12, 16, 20, 22, 24, 26))
COLLS = (4, 2, 3, 0)
NODE = {
    "name": "dgx-h100",
    "gpu": "H100",
    "gpus_per_node": 8,
    "nodes": 1,
    "intra": "nvswitch",
    "nvlink_GBps": 450,
    "nvls": True,
    "pcie_gen": 5,
    "nics_per_node": 8,
    "nic_Gbps": 400,
    "fabric": "infiniband",
    "sharp": False,
}


def write_config(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    f = StateFeatures.model_validate(
        {"world_size": 8, "gpus_per_pod": 8, "replicas": 1, "nproc_per_node": 8, "topology": NODE}
    )
    sc = scale_class(NRANKS, NNODES)
    cells = [
        Cell(
            collective=list(Collective)[c],
            bucket=n.bit_length() - 1,
            scale=sc,
            choices=(Choice(algo=Algo.RING, proto=Proto.LL128),),
            candidates=(
                Candidate(algo=Algo.RING, proto=Proto.SIMPLE, weight=100),
                Candidate(algo=Algo.TREE, proto=Proto.SIMPLE, weight=60),
                Candidate(algo=Algo.RING, proto=Proto.LL, nchannels=8, weight=30),
            ),
            explore=0.25,
        )
        for c in COLLS
        for n in SIZES
    ]
    table = DecisionTable(
        version=1, scales=(sc,), cells=tuple(cells), explore=ExploreSchedule(seed=1)
    )
    (d / "features.json").write_text(f.model_dump_json())
    (d / "table.json").write_text(table.model_dump_json())
    (d / "exploration.json").write_text(
        json.dumps({"mode": "learned", "exploration": {"budgetCalls": 1000000}})
    )
    (d / "job.json").write_text(
        json.dumps({"namespace": "bench", "name": "llm", "kind": "PyTorchJob", "uid": "job-uid"})
    )


def register(path: Path) -> None:
    """The communicator registry entry the plugin would write (state READY last)."""
    with path.open("r+b") as f:
        f.seek(shm.COMMS_OFF + 8)
        f.write(struct.pack("<QQ", COMM, NRANKS | NNODES << 32))
        f.seek(shm.COMMS_OFF)
        f.write(struct.pack("<Q", shm.COMM_READY))


def feed(path: Path, rate: float, seconds: float, out: Path) -> None:
    """The feeder process: `rate` records/s into slot 0's ring, as the plugin writes them."""
    import mmap  # noqa: PLC0415

    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, shm.FILE_SIZE)
    os.close(fd)
    base = shm.PROCS_OFF
    hdr = np.frombuffer(mm, dtype="<u8", count=32, offset=base)
    ring = np.frombuffer(
        mm, dtype=RECORD_DTYPE, count=shm.RING_CAP, offset=base + shm.PROC_HDR_SIZE
    )
    hdr[0] = os.getpid()  # owner
    rng = random.Random(1)
    head, fed, dropped = int(hdr[8]), 0, 0
    t0 = time.monotonic()
    tick = 0.005
    while (now := time.monotonic()) - t0 < seconds:
        due = int((now - t0) * rate) - fed - dropped
        tail = int(hdr[16])
        room = shm.RING_CAP - (head - tail)
        n = min(due, max(room, 0))
        dropped += due - n
        if n > 0:
            pos = np.arange(head, head + n, dtype=np.uint64)
            idx = (pos % shm.RING_CAP).astype(np.intp)
            recs = np.zeros(n, dtype=RECORD_DTYPE)
            picks = [
                (rng.choice(COLLS), rng.choice(SIZES), rng.choice((1, 0)), rng.choice((1, 2)))
                for _ in range(n)
            ]
            recs["comm_id"] = COMM
            recs["coll"] = [p[0] for p in picks]
            recs["nbytes"] = [p[1] for p in picks]
            recs["algo"] = [p[2] for p in picks]
            recs["proto"] = [p[3] for p in picks]
            recs["nchannels"] = 16
            recs["exec_ns"] = [
                int(1000 + p[1] / 200 * (1 + 0.1 * p[3]) * rng.lognormvariate(0, 0.03))
                for p in picks
            ]
            recs["coll_seq"] = pos
            recs["n_kernel_ch"] = 16
            body = recs.copy()
            body["seq"] = 0
            ring[idx] = body  # bodies first ...
            ring["seq"][idx] = pos + 1  # ... then the sequence words (x86: stores stay in order)
            head += n
            hdr[8] = head
            fed += n
        time.sleep(tick)
    out.write_text(json.dumps({"fed": fed, "dropped": dropped}))

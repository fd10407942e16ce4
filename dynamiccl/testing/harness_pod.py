"""The main container of a training pod on the real node: NCCL played against the injected plugin.

Runs inside the pod with the runtime image's Python. The real-node demo
(`dynamiccl/demo/real_sequence.py`) and the real test tier ship this file in a
ConfigMap and run it as a script (so an image built before a change to it
still runs the current one). It loads the plugin the way
NCCL's loaders do: ``dlopen`` of the path ``NCCL_TUNER_PLUGIN`` /
``NCCL_PROFILER_PLUGIN`` name, then the newest versioned symbol the library
exports (``ncclTunerPlugin_v6`` ... / ``ncclProfiler_v5`` ...). For every
collective of every training step it passes NCCL's cost table to
``getCollInfo``, takes NCCL's resulting choice, "runs" it and reports the GPU
timestamps through the profiler ABI (``dynamiccl.testing.nccl_player.play_call``).

Stand-ins: there is no GPU on the real node. A call's time comes from a
response surface (``dynamiccl.testing.surface``: the calibrated simulator's times
for the job's topology, except that one algorithm runs slower than NCCL's cost
model and the shipped prior think, given in ``args.json``). As torchrun would, the
container starts one process per local rank (``nranks / pods``); all ranks play
the same calls with the same jitter, as every rank of a communicator sees the
same collectives.

Output: local rank 0 prints a JSON line per progress report on stdout
(``{"progress": ...}``); every rank a final ``{"summary": ...}`` line: calls,
the plugin's choices per call, the mean played time, the plugin's log lines
and the shared-memory file's epoch entries with a digest of each committed
table (the plugin's own state).
"""

from __future__ import annotations

import ctypes as ct
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import IO, Any

import dynamiccl
from dynamiccl.sidecar.ctypes_abi import PROFILER_VERSIONS, TUNER_VERSIONS

HARNESS_DIR = Path(os.environ.get("HARNESS_DIR", "/harness"))
# The runtime image does not ship dynamiccl.testing: the harness ConfigMap carries the modules
# this script imports from it, mounted under HARNESS_DIR/dynamiccl (`real_manifests.PLAYER_FILES`).
if importlib.util.find_spec("dynamiccl.testing") is None:
    dynamiccl.__path__.append(str(HARNESS_DIR / "dynamiccl"))

from dynamiccl.api.nccl import Algo, Collective  # noqa: E402
from dynamiccl.sidecar.shm import EPOCH_COMMITTED, ShmError, ShmFile  # noqa: E402
from dynamiccl.sidecar.shm_table import MAX_EPOCHS  # noqa: E402
from dynamiccl.testing.nccl_player import (  # noqa: E402
    Comm,
    Plugin,
    ProfiledComm,
    by_choice,
    nccl_pick,
    play_call,
)
from dynamiccl.testing.rank import _Ring  # noqa: E402
from dynamiccl.testing.surface import Surface  # noqa: E402
from dynamiccl.testing.workload import TimeTable, call_key  # noqa: E402


class Slowed(Surface):
    """The simulator's surface, one algorithm slower than NCCL's model (and the prior) think."""

    def __init__(self, times: TimeTable, departure: dict[str, Any], seed: int) -> None:
        super().__init__(times, None, seed)
        self.coll = Collective(departure["collective"]).nccl_id
        self.min_bytes = int(departure["min_bytes"])
        self.algo = Algo(departure["algo"]).nccl_id
        self.factor = float(departure["slower"])

    def mean_us(self, coll: int, nbytes: int, algo: int, proto: int, nch: int) -> float:
        t = super().mean_us(coll, nbytes, algo, proto, nch)
        hit = coll == self.coll and nbytes >= self.min_bytes and algo == self.algo
        return t * self.factor if hit else t


def newest(lib: ct.CDLL, prefix: str, versions: tuple[int, ...]) -> int:
    """The newest ABI version the library exports (NCCL's loader: dlsym newest first)."""
    for v in sorted(versions, reverse=True):
        try:
            getattr(lib, f"{prefix}{v}")
        except AttributeError:
            continue
        return v
    raise RuntimeError(f"no {prefix}* symbol exported")


def epochs(path: str) -> list[dict[str, Any]]:
    """The shared-memory file's committed epochs: boundary and a digest of the table image."""
    out: list[dict[str, Any]] = []
    try:
        with ShmFile(Path(path)) as f:
            for e in range(1, MAX_EPOCHS):
                status, boundary = f.entry(e)
                if status == EPOCH_COMMITTED:
                    digest = hashlib.sha256(f.read_table(e)).hexdigest()[:16]
                    out.append({"epoch": e, "boundary": boundary, "table": digest})
    except (OSError, ShmError, ValueError) as exc:
        return [{"error": f"{type(exc).__name__}: {exc}"}]
    return out


def own_us(surface: Surface, coll: int, nbytes: int) -> float:
    """The mean time of NCCL's own choice for the call: the lowest entry of NCCL's cost table,
    at NCCL's channels (what the call costs without the plugin)."""
    pick = nccl_pick(surface.cost(coll, nbytes))
    if pick is None:
        raise ValueError(f"NCCL's cost table has no runnable entry for {coll}:{nbytes}")
    a, p = pick
    return surface.mean_us(coll, nbytes, a, p, surface.nccl_channels(coll, nbytes, a, p))


def by_epoch(
    taken: list[dict[str, Any]], played_at: list[tuple[str, float, float, float]]
) -> list[dict[str, Any]]:
    """Per table in effect: NCCL's own choice before the first epoch, then each committed epoch
    from its boundary on (the plugin's rule: the largest committed epoch with boundary <= call
    index); only epochs that took effect (boundary < the calls made). Per key: calls, played
    us, and the surface's mean us of NCCL's own choice and of what ran (no jitter)."""
    calls = len(played_at)
    bounds = sorted(
        (int(e["boundary"]), int(e["epoch"]))
        for e in taken
        if "epoch" in e and int(e["boundary"]) < calls
    )
    starts = [(0, 0), *bounds]
    out: list[dict[str, Any]] = []
    for j, (start, epoch) in enumerate(starts):
        end = starts[j + 1][0] if j + 1 < len(starts) else calls
        per_key: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for key, t, own, ran in played_at[start:end]:
            acc = per_key[key]
            acc[0] += 1
            acc[1] += t
            acc[2] += own
            acc[3] += ran
        out.append(
            {
                "epoch": epoch,
                "from": start,
                "calls": end - start,
                "keys": {
                    k: {
                        "calls": int(n),
                        "played_us": round(pl, 1),
                        "nccl_us": round(o, 1),
                        "ran_us": round(r, 1),
                    }
                    for k, (n, pl, o, r) in per_key.items()
                },
            }
        )
    return out


def launch(per_pod: int) -> int:
    """torchrun's part: one process per local rank, this pod's output is theirs; 0 if all did.
    Their lines are relayed whole (a summary line is longer than a pipe writes atomically:
    written straight to the shared stdout, another rank's line could cut it)."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__],
            env={**os.environ, "HARNESS_LOCAL_RANK": str(i)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(per_pod)
    ]
    lock = threading.Lock()

    def relay(out: IO[str]) -> None:
        for line in out:
            with lock:
                sys.stdout.write(line)
                sys.stdout.flush()

    threads = [threading.Thread(target=relay, args=(p.stdout,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    codes = [p.wait() for p in procs]
    for t in threads:
        t.join(timeout=10)
    return max(codes, key=abs)


def play_rank(args: dict[str, Any], local: int) -> int:
    """One rank: a process with its own plugin state, as NCCL runs one per GPU."""
    os.nice(10)  # the GPU's work, played on the CPU, must not starve the sidecar (as rank.py)
    per_pod = int(args["nranks"]) // max(int(args["pods"]), 1)
    # a Worker-only PyTorchJob's pods get no RANK: the replica index ends the pod's name
    pod = int(os.environ.get("HOSTNAME", "x-0").rsplit("-", 1)[1])
    rank = pod * per_pod + local
    surface = Slowed(TimeTable.read(HARNESS_DIR / "times.json"), args["departure"], args["seed"])
    tuner_path = os.environ["NCCL_TUNER_PLUGIN"]
    plugin = Plugin(Path(tuner_path))
    prof_lib = ct.CDLL(os.environ["NCCL_PROFILER_PLUGIN"])  # same .so: dlopen's handle is shared
    tver = newest(plugin.lib, "ncclTunerPlugin_v", tuple(TUNER_VERSIONS))
    pver = newest(prof_lib, "ncclProfiler_v", tuple(PROFILER_VERSIONS))
    nranks, nnodes, comm_id = args["nranks"], args["nnodes"], args["comm_id"]
    # NCCL >= 2.27 inits a communicator's profiler before its tuner
    prof = ProfiledComm(plugin, pver, nranks, nnodes, comm_id=comm_id, rank=rank)
    comm = Comm(plugin, tver, nranks, nnodes, comm_id=comm_id)
    ring = _Ring()
    shm_path = os.environ.get("DYNAMICCL_SHM_PATH", "")
    print(json.dumps({"started": {"t": time.time(), "uid": os.getuid()}}), flush=True)
    decisions: dict[str, Counter[str]] = defaultdict(Counter)
    played: dict[str, float] = defaultdict(float)
    # every call's key, played time, and the surface's mean time of NCCL's own choice and of
    # what ran, by call index: the plugin's epochs are per call index (one communicator), so
    # what each table cost against NCCL's choice is known afterwards
    played_at: list[tuple[str, float, float, float]] = []
    own: dict[str, float] = {}
    calls = 0
    t0 = time.monotonic()
    step_s = float(args["step_s"])
    time_of = by_choice(surface.play_us)
    for step in range(int(args["steps"])):
        start = time.monotonic()
        for coll, nbytes, repeat in args["ops"]:
            key = call_key(coll, nbytes)
            for _ in range(repeat):
                ch = play_call(
                    comm, coll, nbytes, surface.cost(coll, nbytes), time_of, prof,
                    channels=surface.nccl_channels, chunk=tver >= 6,  # NCCL 2.27+: chunk size
                )  # fmt: skip
                a, p, nch, t = ch.algo, ch.proto, ch.nchannels, ch.time_us
                decisions[key][f"{a}:{p}:{ch.plugin_channels}"] += 1
                played[key] += t
                if key not in own:
                    own[key] = own_us(surface, coll, nbytes)
                played_at.append((key, t, own[key], surface.mean_us(coll, nbytes, a, p, nch)))
                calls += 1
                if calls % 16 == 0:
                    ring.wait_for_room()
        if step % 100 == 99 and local == 0:
            committed = len([e for e in epochs(shm_path) if "epoch" in e])
            progress = {"step": step + 1, "calls": calls, "t": time.time(), "committed": committed}
            print(json.dumps({"progress": progress}), flush=True)
        rest = step_s - (time.monotonic() - start)
        if rest > 0:
            time.sleep(rest)
    comm.finalize()
    prof.finalize()
    taken = epochs(shm_path)
    summary = {
        "rank": rank,
        "uid": os.getuid(),
        "tuner_abi": tver,
        "profiler_abi": pver,
        "calls": calls,
        "seconds": round(time.monotonic() - t0, 2),
        "decisions": {k: dict(v) for k, v in decisions.items()},
        "played_us": dict(played),
        "epochs": taken,
        "by_epoch": by_epoch(taken, played_at),
        "log": [m[:200] for _, m in plugin.logs][:8],  # one line < PIPE_BUF: no interleaving
    }
    print(json.dumps({"summary": summary}), flush=True)
    return 0


def main() -> int:
    args = json.loads((HARNESS_DIR / "args.json").read_text())
    local = os.environ.get("HARNESS_LOCAL_RANK")
    if local is None:
        return launch(int(args["nranks"]) // max(int(args["pods"]), 1))
    return play_rank(args, int(local))


if __name__ == "__main__":
    sys.exit(main())

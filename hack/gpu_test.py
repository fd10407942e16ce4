"""`make gpu-test`: the plugin in real NCCL on this machine's GPUs, and a measured response surface.

Where no CUDA GPU is present it prints one line and exits 0.  With one GPU it runs
hack/gpu_sweep.py at 2 and 4 ranks on that GPU (each rank its own NCCL node over loopback
sockets, hack/gpu_layout.py).  Where there are several GPUs:

1. builds the plugin for this architecture against glibc 2.17 (`make -C plugin dist`);
2. for each (algorithm, protocol) that can run on one node, starts one process per GPU
   (hack/gpu_worker.py: torch.distributed over NCCL from the torch wheel, a communicator over
   every GPU) with NCCL_TUNER_PLUGIN / NCCL_PROFILER_PLUGIN = the plugin and a shared-memory file
   whose committed table forces that (algorithm, protocol) for all-reduce, all-gather and
   reduce-scatter at every size (from the plugin's call L on);
3. checks NCCL's INFO lines: the tuner and the profiler were loaded, the plugin mapped the file,
   the profiler pushed records, and for every timed (collective, size) NCCL's TUNING line names
   the forced (algorithm, protocol) -- where it names another, NCCL ruled the pair out there (the
   plugin never forces an entry NCCL marks unavailable) and the pair is left out of the surface;
4. writes the confirmed times as a response surface (docs/simulator.md, '6. Response surfaces'):
   `collective,nbytes,algo,proto,nchannels,time_us,stddev_us` (time = per iteration the slowest
   rank, mean and standard deviation over iterations; nchannels empty = NCCL's default).

usage: .venv/bin/python hack/gpu_test.py [--out DIR] [--iters N] [--sizes B,B,...]
One machine (one node) only; multi-node algorithms (NVLS tree, CollNet, PAT) are not swept.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nccl_log

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "hack" / "gpu_worker.py"  # one rank (tests substitute a CUDA-free stand-in)
HEADER = ("collective", "nbytes", "algo", "proto", "nchannels", "time_us", "stddev_us")
NCCL_FUNC = {"allreduce": "AllReduce", "allgather": "AllGather", "reducescatter": "ReduceScatter"}
SIZES = tuple(1 << s for s in range(12, 29, 2))  # 4 KiB .. 256 MiB (the tuner's nBytes)
INTERVAL = 64  # the shared-memory file's epoch interval L: the table is in effect from call L
# NCCL 2.28+: "TUNER/Plugin: Using dynamiccl (v6)", "PROFILER/Plugin: Loaded dynamiccl (v6)";
# NCCL 2.27: "TUNER/Plugin: Using tuner plugin dynamiccl", "PROFILER/Plugin: loaded dynamiccl"
TUNER_RE = re.compile(r"TUNER/Plugin: Using (?:tuner plugin )?dynamiccl\b")
PROFILER_RE = re.compile(r"PROFILER/Plugin: [Ll]oaded dynamiccl\b")


@dataclass(frozen=True)
class Config:
    """One forced (algorithm, protocol) and the collectives it can run on one node."""

    algo: str
    proto: str
    collectives: tuple[str, ...]
    nchannels: int = 0  # 0: NCCL's channel count

    @property
    def name(self) -> str:
        return f"{self.algo}-{self.proto}" + (f"-c{self.nchannels}" if self.nchannels else "")


def configs() -> list[Config]:
    """The single-node (algo, proto) pairs: ring and tree in every protocol, NVLS in SIMPLE."""
    out = [
        Config("ring", p, ("allreduce", "allgather", "reducescatter"))
        for p in ("ll", "ll128", "simple")
    ]
    out += [Config("tree", p, ("allreduce",)) for p in ("ll", "ll128", "simple")]
    out.append(Config("nvls", "simple", ("allreduce", "allgather", "reducescatter")))
    return out


def parse_tuning(lines: Iterable[str]) -> dict[tuple[str, int], set[tuple[str, str]]]:
    """(NCCL function name, count x size bytes) -> the (algo, proto) NCCL's TUNING lines say ran."""
    ran: dict[tuple[str, int], set[tuple[str, str]]] = {}
    for t in nccl_log.parse(lines).tuning:
        ran.setdefault((t.func, t.count_bytes), set()).add((t.algo, t.proto))
    return ran


@dataclass
class Points:
    """The sweep of one configuration, sorted by what NCCL's TUNING lines say ran."""

    rows: list[tuple[str, ...]]  # confirmed: CSV rows
    ruled_out: list[str]  # NCCL ran another pair there (it marked the forced one unavailable)
    mixed: list[str]  # the forced pair and others: the table was not in effect throughout


def surface_rows(
    cfg: Config,
    per_rank: Sequence[Sequence[dict[str, Any]]],
    ran: dict[tuple[str, int], set[tuple[str, str]]],
) -> Points:
    """Each timed (collective, size) point of cfg, classified by the pairs NCCL ran for it."""
    pts = Points([], [], [])
    forced = (cfg.algo, cfg.proto)
    for points in zip(*per_rank, strict=True):
        coll, nbytes = str(points[0]["collective"]), int(points[0]["nbytes"])
        seen = ran.get((NCCL_FUNC[coll], int(points[0]["count_bytes"])), set())
        what = f"{coll} {nbytes} B: NCCL ran " + (
            ", ".join(f"{a}/{p}" for a, p in sorted(seen)) or "nothing it logged"
        )
        if seen != {forced}:
            (pts.mixed if forced in seen else pts.ruled_out).append(what)
            continue
        times = [[float(t) for t in p["times_us"]] for p in points]
        slowest = [max(it) for it in zip(*times, strict=True)]  # per iteration, the slowest rank
        sd = statistics.stdev(slowest) if len(slowest) > 1 else 0.0
        mean = statistics.fmean(slowest)
        pts.rows.append((coll, str(nbytes), cfg.algo, cfg.proto, "", f"{mean:.3f}", f"{sd:.3f}"))
    return pts


def write_surface(path: Path, rows: Iterable[Sequence[str]]) -> None:
    """The response-surface CSV (docs/simulator.md, '6. Response surfaces')."""
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(HEADER)
        w.writerows(rows)


def gpu_count() -> tuple[int, str]:
    """(number of CUDA GPUs torch sees, why 0)."""
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        return 0, f"torch is not importable ({e})"
    if not torch.cuda.is_available():
        return 0, "torch.cuda.is_available() is False"
    return torch.cuda.device_count(), ""


def forcing_table(cfg: Config, world: int, nnodes: int = 1) -> Any:
    """A DecisionTable that forces cfg for its collectives at every size (world ranks, nnodes)."""
    from dynamiccl.api.nccl import Algo, Collective, Proto  # noqa: PLC0415
    from dynamiccl.api.table import Cell, Choice, DecisionTable, scale_class  # noqa: PLC0415

    sc = scale_class(world, nnodes)
    choice = Choice(algo=Algo(cfg.algo), proto=Proto(cfg.proto), nchannels=cfg.nchannels)
    cells = tuple(
        Cell(collective=Collective(c), bucket=b, scale=sc, choices=(choice,))
        for c in cfg.collectives
        for b in range(41)
    )
    return DecisionTable(version=1, scales=(sc,), cells=cells)


def _table_file(cfg: Config, world: int, path: Path) -> None:
    """A shared-memory file whose epoch 1 (committed, from call L) forces cfg everywhere."""
    from dynamiccl.sidecar import shm, shm_table  # noqa: PLC0415

    shm.create(path, INTERVAL)
    f = shm.ShmFile(path)
    try:
        f.write_table(1, shm_table.encode_table(forcing_table(cfg, world), 1))
        f.set_entry(1, shm.EPOCH_COMMITTED, INTERVAL)
    finally:
        f.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_config(cfg: Config, world: int, so: Path, out: Path, sweep: dict[str, Any]) -> Path:
    """Start one worker per GPU for cfg; returns its directory (JSON results + NCCL logs)."""
    d = out / cfg.name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    _table_file(cfg, world, d / "dynamiccl.shm")
    spec = {**sweep, "collectives": cfg.collectives, "interval": INTERVAL, "out_dir": str(d)}
    (d / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_ALGO", "NCCL_PROTO")}
    env |= {
        "NCCL_TUNER_PLUGIN": str(so),
        "NCCL_PROFILER_PLUGIN": str(so),
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING",
        "NCCL_DEBUG_FILE": str(d / "nccl.%h.%p.log"),
        "DYNAMICCL_SHM_PATH": str(d / "dynamiccl.shm"),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(world),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(d / "spec.json")],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=(d / f"rank{r}.out").open("w"),
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    codes = _wait_all(procs, 900)
    if any(codes):
        first = min(range(world), key=lambda r: (codes[r] <= 0, r))  # a rank that failed by itself
        tail = (d / f"rank{first}.out").read_text()[-1500:]
        raise RuntimeError(f"{cfg.name}: workers exited {codes}; see {d}/rank*.out:\n{tail}")
    return d


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    """Exit codes; once one rank fails (or time runs out) the others are killed, not waited for
    (they would wait in NCCL for the failed rank forever)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            p.kill()
    return [p.wait() for p in procs]


def _check_loaded(d: Path, log_text: str) -> str:
    """The NCCL INFO lines that prove the plugin ran as tuner and profiler, or an error."""
    tuner, prof = TUNER_RE.search(log_text), PROFILER_RE.search(log_text)
    if not tuner or not prof:
        what = "tuner" if not tuner else "profiler"
        return f"NCCL did not load the plugin as {what} (see {d}/nccl.*.log)"
    if "DynamICCL: using" not in log_text:
        return f"the plugin did not map {d}/dynamiccl.shm (see {d}/nccl.*.log)"
    return ""


def slot_report(path: Path) -> tuple[int, int, int]:
    """From the file's process slots: the highest tuner and profiler ABI versions NCCL loaded
    (bytes 32, 33) and the records the profiler pushed into the rings (head counters, byte 64)."""
    from dynamiccl.sidecar import shm  # noqa: PLC0415

    data = path.read_bytes()
    offs = [shm.PROCS_OFF + i * shm.PROC_SLOT_SIZE for i in range(shm.MAX_PROCS)]
    tuner = max(data[off + 32] for off in offs)
    profiler = max(data[off + 33] for off in offs)
    return tuner, profiler, sum(int.from_bytes(data[off + 64 : off + 72], "little") for off in offs)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=ROOT / "plugin" / "build" / "gpu-test")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(SIZES))
    args = ap.parse_args(argv)
    n, why = gpu_count()
    if n == 0:
        print(f"gpu-test: skipped, no CUDA GPU on this machine ({why})")
        return 0
    subprocess.run(["make", "-s", "-C", str(ROOT / "plugin"), "dist"], check=True)
    so = ROOT / "plugin" / "build" / "dist" / platform.machine() / "libnccl-tuner-dynamiccl.so"
    if n == 1:  # 2 and 4 ranks on device 0, each its own NCCL node (hack/gpu_layout.py)
        import gpu_sweep  # noqa: PLC0415

        sizes = ",".join(str(s) for s in args.sizes)
        return gpu_sweep.main(["--ranks", "2,4", "--gpus", "1", "--out", str(args.out),
                               "--so", str(so), "--sizes", sizes])  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, ...]] = []
    for cfg in configs():
        try:
            d = run_config(cfg, n, so, args.out, {"sizes": args.sizes, "iters": args.iters})
        except (RuntimeError, OSError) as e:
            print(f"gpu-test: FAILED: {e}")
            return 1
        text = "".join(p.read_text(errors="replace") for p in sorted(d.glob("nccl.*.log")))
        err = _check_loaded(d, text)
        if err:
            print(f"gpu-test: FAILED: {err}")
            return 1
        results = [json.loads(p.read_text()) for p in sorted(d.glob("rank*.json"))]
        pts = surface_rows(cfg, results, parse_tuning(text.splitlines()))
        tuner, prof, records = slot_report(d / "dynamiccl.shm")
        print(
            f"gpu-test: {cfg.name}: tuner ABI v{tuner}, profiler ABI v{prof}, {records} profiler "
            f"records; {len(pts.rows)} points ran {cfg.algo}/{cfg.proto} as forced, "
            f"{len(pts.ruled_out)} ruled out by NCCL"
        )
        if not records:
            print(f"gpu-test: FAILED: {cfg.name}: the profiler pushed no record")
            return 1
        if pts.mixed:
            print(
                f"gpu-test: FAILED: {cfg.name}: forced choice not always in effect: {pts.mixed[:3]}"
            )
            return 1
        rows += pts.rows
    write_surface(args.out / "surface.csv", rows)
    print(f"gpu-test: {len(rows)} rows on {n} GPUs -> {args.out / 'surface.csv'}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())

"""The real response surface: every runnable (algorithm, protocol, channels) and NCCL's own choice.

For one communicator of N ranks (hack/gpu_layout.py: on one GPU, N processes on device 0,
each its own NCCL host, sockets over loopback) one process per rank
(hack/gpu_sweep_worker.py) runs every configuration in turn. The shared-memory file holds one
committed epoch per configuration (`plan`): from its boundary on the plugin forces that
(algorithm, protocol, channels) for all-reduce, all-gather and reduce-scatter at every size;
before the first boundary NCCL decides (segment `nccl`). One process start per N, not one
per configuration. Rank 0's TUNING lines, consumed in call order per (collective, bytes),
say what NCCL ran for every timed call (`classify`): the forced pair and channel count ->
a row of the surface; another pair -> NCCL ruled the forced one out there (the plugin never
forces what NCCL marks unavailable); a mix -> the table was not in effect throughout (an
error). Multi-node algorithms (CollNet, NVLS) do not exist on this fabric; PAT does (one
rank per node).

usage: python hack/gpu_sweep.py --ranks N --out DIR [--sizes B,...] [--so PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpu_layout
import gpu_losses
import gpu_test
import nccl_log

WORKER = Path(__file__).resolve().with_name("gpu_sweep_worker.py")  # tests substitute a stand-in
CHANNELS = (0, 1, 2)  # 0: NCCL's channel count; sockets over loopback give it 2 (NCCL's log says)
PROTOS = ("ll", "ll128", "simple")
ALL = ("allreduce", "allgather", "reducescatter")
WARMUP = 2
INTERVAL = 64
MARGIN = 16  # calls between a boundary and the first timed call (and before the next one)
SIZES = gpu_test.SIZES
# Largest size forced per protocol. On the first real run (NCCL 2.28.9, two ranks on one H200,
# sockets over loopback) a forced LL all-gather of 256 MiB did not finish within the sweep's
# deadline and took every later configuration with it; NCCL's own pick leaves LL at 64 KiB.
MAX_BYTES = {"ll": 4 << 20, "ll128": 64 << 20, "simple": 256 << 20}


def iters_for(nbytes: int) -> int:
    """Timed iterations of a point: fewer for big ones (socket all-reduces of 256 MiB are slow)."""
    if nbytes <= 1 << 20:
        return 20
    if nbytes <= 16 << 20:
        return 10
    return 5 if nbytes <= 64 << 20 else 3


def configs() -> list[gpu_test.Config]:
    """Ring in every protocol (all three), tree (all-reduce), PAT (AG, RS; SIMPLE), x channels."""
    out = []
    for nch in CHANNELS:
        out += [gpu_test.Config("ring", p, ALL, nch) for p in PROTOS]
        out += [gpu_test.Config("tree", p, ("allreduce",), nch) for p in PROTOS]
        out.append(gpu_test.Config("pat", "simple", ("allgather", "reducescatter"), nch))
    return out


@dataclass(frozen=True)
class Segment:
    """One configuration's calls: from `start` (this process's call count) for `calls` calls."""

    label: str
    cfg: gpu_test.Config | None  # None: NCCL's own choice (no table)
    boundary: int  # the epoch's first call (0: none)
    start: int
    calls: int
    sizes: tuple[int, ...]


def _calls(collectives: Sequence[str], sizes: Sequence[int]) -> int:
    return len(collectives) * sum(WARMUP + iters_for(s) for s in sizes)


def plan(cfgs: Sequence[gpu_test.Config], sizes: Sequence[int]) -> list[Segment]:
    """NCCL's own choice first, then one epoch per configuration, MARGIN calls either side;
    a configuration runs the sizes up to its protocol's MAX_BYTES."""
    segs = [Segment("nccl", None, 0, 0, _calls(ALL, sizes), tuple(sizes))]
    pos = segs[0].calls
    for cfg in cfgs:
        boundary = -(-(pos + MARGIN) // INTERVAL) * INTERVAL
        mine = tuple(n for n in sizes if n <= MAX_BYTES.get(cfg.proto, n))
        seg = Segment(
            cfg.name, cfg, boundary, boundary + MARGIN, _calls(cfg.collectives, mine), mine
        )
        segs.append(seg)
        pos = seg.start + seg.calls
    return segs


def write_file(path: Path, segs: Sequence[Segment], world: int, nnodes: int) -> None:
    """The shared-memory file: epoch e (committed) forces segment e's configuration."""
    from dynamiccl.sidecar import shm, shm_table  # noqa: PLC0415

    shm.create(path, INTERVAL)
    f = shm.ShmFile(path)
    try:
        for e, seg in enumerate(segs[1:], 1):
            assert seg.cfg is not None
            table = gpu_test.forcing_table(seg.cfg, world, nnodes)
            f.write_table(e, shm_table.encode_table(table, e))
            f.set_entry(e, shm.EPOCH_COMMITTED, seg.boundary)
    finally:
        f.close()


@dataclass
class Classified:
    """The sweep's points sorted by what NCCL's TUNING lines say ran."""

    forced: list[gpu_losses.Point] = field(default_factory=list)
    nccl: list[gpu_losses.Point] = field(default_factory=list)
    ruled_out: list[str] = field(default_factory=list)
    channels_differ: list[str] = field(default_factory=list)
    mixed: list[str] = field(default_factory=list)
    unlogged: list[str] = field(default_factory=list)


def _point(
    cfg: gpu_test.Config | None, pts: Sequence[dict[str, Any]], ran: tuple[str, str, int]
) -> gpu_losses.Point:
    times = [[float(t) for t in p["times_us"]] for p in pts]
    slowest = [max(it) for it in zip(*times, strict=True)]  # per iteration, the slowest rank
    sd = statistics.stdev(slowest) if len(slowest) > 1 else 0.0
    algo, proto, nch = ran if cfg is None else (cfg.algo, cfg.proto, cfg.nchannels)
    p0 = pts[0]
    n = len(slowest)
    return gpu_losses.Point(
        str(p0["collective"]), int(p0["nbytes"]), algo, proto, nch, statistics.fmean(slowest), sd, n
    )


def classify(
    segs: Sequence[Segment], per_rank: Sequence[Sequence[dict[str, Any]]], log: nccl_log.NcclLog
) -> Classified:
    """Each timed point, by the TUNING lines of its calls (consumed in call order)."""
    out = Classified()
    queues = {k: collections.deque(v) for k, v in nccl_log.tuning_by_call(log).items()}
    cfg_of = {s.label: s.cfg for s in segs}
    common = min(len(r) for r in per_rank)  # a stopped run: the points every rank finished
    for pts in zip(*(r[:common] for r in per_rank), strict=True):
        p0 = pts[0]
        cfg = cfg_of[p0["segment"]]
        what = f"{p0['segment']}: {p0['collective']} {p0['nbytes']} B"
        q = queues.get((gpu_test.NCCL_FUNC[p0["collective"]], int(p0["count_bytes"])))
        n_timed = len(p0["times_us"])
        lines = [q.popleft() for _ in range(WARMUP + n_timed) if q][WARMUP:] if q else []
        if len(lines) < n_timed:
            out.unlogged.append(f"{what}: {len(lines)} TUNING lines for {n_timed} timed calls")
            continue
        ran = collections.Counter((t.algo, t.proto, t.nchannels) for t in lines)
        pairs = {(a, p) for a, p, _ in ran}
        top = ran.most_common(1)[0][0]
        if cfg is None:
            out.nccl.append(_point(None, pts, top))
            continue
        forced = (cfg.algo, cfg.proto)
        seen = ", ".join(f"{a}/{p}/{c}" for a, p, c in sorted(ran))
        if forced not in pairs:
            out.ruled_out.append(f"{what}: NCCL ran {seen}")
        elif len(pairs) > 1:
            out.mixed.append(f"{what}: NCCL ran {seen}")
        elif cfg.nchannels and {c for _, _, c in ran} != {cfg.nchannels}:
            out.channels_differ.append(f"{what}: forced {cfg.nchannels} channels, NCCL ran {seen}")
        else:
            out.forced.append(_point(cfg, pts, top))
    return out


def surface_rows(points: Sequence[gpu_losses.Point]) -> list[tuple[str, ...]]:
    """Rows of the response-surface CSV (nchannels empty: NCCL's own channel count)."""
    rows: list[tuple[str, ...]] = []
    for p in points:
        nch = str(p.nchannels) if p.nchannels else ""
        rows.append(
            (
                p.collective,
                str(p.nbytes),
                p.algo,
                p.proto,
                nch,
                f"{p.mean_us:.3f}",
                f"{p.sd_us:.3f}",
            )
        )
    return rows


def launch(
    segs: Sequence[Segment],
    sizes: Sequence[int],
    world: int,
    gpus: int,
    *,
    so: Path,
    d: Path,
    deadline_s: float = 900.0,
) -> list[dict[str, Any]]:
    """Run the plan on `world` ranks laid out on `gpus` GPUs; the ranks' results (at the
    deadline the ranks are stopped and the segments every rank finished are kept)."""
    d.mkdir(parents=True, exist_ok=True)
    log = str(d / "nccl.rank{rank}.log")
    procs = gpu_layout.layout(gpus, world, gpu_test._free_port(), debug_file=log)
    write_file(d / "dynamiccl.shm", segs, world, gpu_layout.nodes(procs))
    spec = {
        "segments": [
            {
                "label": s.label,
                "start": s.start,
                "collectives": s.cfg.collectives if s.cfg else ALL,
                "sizes": list(s.sizes),
            }
            for s in segs
        ],
        "sizes": list(sizes),
        "iters": {str(n): iters_for(n) for n in sizes},
        "warmup": WARMUP,
        "out_dir": str(d),
    }
    (d / "spec.json").write_text(json.dumps(spec))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "DYNAMICCL_"))}
    base |= {
        "NCCL_TUNER_PLUGIN": str(so),
        "NCCL_PROFILER_PLUGIN": str(so),
        "DYNAMICCL_SHM_PATH": str(d / "dynamiccl.shm"),
    }
    running = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(d / "spec.json")],
            env=base | dict(p.env),
            stdout=(d / f"rank{p.rank}.out").open("w"),
            stderr=subprocess.STDOUT,
        )
        for p in procs
    ]
    codes = gpu_test._wait_all(running, deadline_s)
    files = [d / f"rank{r}.json" for r in range(world)]
    if any(codes) and not all(f.is_file() for f in files):
        tail = (d / "rank0.out").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{world} ranks: workers exited {codes}; see {d}/rank*.out:\n{tail}")
    return [json.loads(f.read_text()) for f in files]


def ring_check(path: Path) -> dict[str, int]:
    """The profiler's records: pushed + dropped per process, and how many of those still in
    the ring lack GPU timestamps (start >= stop or no execution time)."""
    from dynamiccl.sidecar import shm  # noqa: PLC0415

    out = {"pushed": 0, "dropped": 0, "in_ring": 0, "without_timestamps": 0}
    with shm.ShmFile(path) as f:
        for i in range(shm.MAX_PROCS):  # a process that exited cleared its owner pid
            head, _, dropped = f.ring_counters(i)
            out["pushed"] += head
            out["dropped"] += dropped
            recs = f.drain(i)
            out["in_ring"] += len(recs)
            out["without_timestamps"] += sum(
                1 for r in recs if not (0 < r.start_ns < r.stop_ns) or r.exec_ns <= 0
            )
    return out


def _loss(x: gpu_losses.Loss) -> dict[str, Any]:
    return {
        "collective": x.collective,
        "nbytes": x.nbytes,
        "nccl": x.nccl.label,
        "nccl_us": round(x.nccl.mean_us, 3),
        "best": x.best.label,
        "best_us": round(x.best.mean_us, 3),
        "saving": round(x.saving, 4),
        "z": round(x.z, 2) if x.z != float("inf") else "inf",
        "outside_noise": x.significant,
    }


def report(
    world: int, log: nccl_log.NcclLog, cl: Classified, ring: dict[str, int], calls: int
) -> dict[str, Any]:
    """What one world size's sweep showed (the summary's `sweep` entry)."""
    tried = len(cl.forced) + len(cl.ruled_out) + len(cl.channels_differ) + len(cl.mixed)
    return {
        "ranks": world,
        "nccl_version": log.version_text,
        "tuner": log.tuner.__dict__ if log.tuner else None,
        "profiler": log.profiler.__dict__ if log.profiler else None,
        "nnodes_seen": sorted({c.nnodes for c in log.comms}),
        "network": log.network,
        "coll_channels": log.coll_channels,
        "plugin_mapped": any(line.startswith("using ") for line in log.plugin_lines),
        "plugin_lines": log.plugin_lines[:20],
        "warnings": log.warnings[:20],
        "chunk_clamps": len(log.clamps),
        "forced_points_tried": tried,
        "forced_points_confirmed": len(cl.forced),
        "ruled_out": cl.ruled_out,
        "channels_differ": cl.channels_differ,
        "mixed": cl.mixed,
        "unlogged": cl.unlogged,
        "profiler_ring": ring,
        "calls_per_rank": calls,
        "nccl_losses": [_loss(x) for x in gpu_losses.losses(cl.forced, cl.nccl)],
    }


def run_world(
    world: int, gpus: int, sizes: Sequence[int], so: Path, out: Path, *, deadline_s: float = 900.0
) -> dict[str, Any]:
    """Sweep one world size: surface-N.csv, nccl-pick-N.csv and the report under `out`."""
    segs = plan(configs(), sizes)
    d = out / f"sweep-{world}"
    results = launch(segs, sizes, world, gpus, so=so, d=d, deadline_s=deadline_s)
    log = nccl_log.parse((d / "nccl.rank0.log").read_text(errors="replace").splitlines())
    cl = classify(segs, [r["points"] for r in results], log)
    gpu_test.write_surface(out / f"surface-{world}.csv", surface_rows(cl.forced))
    gpu_test.write_surface(out / f"nccl-pick-{world}.csv", surface_rows(cl.nccl))
    rep = report(world, log, cl, ring_check(d / "dynamiccl.shm"), int(results[0]["calls"]))
    rep["complete"] = all(r.get("complete") for r in results)
    rep["segments_done"] = len({p["segment"] for p in results[0]["points"]})
    rep["segments_planned"] = len(segs)
    (d / "report.json").write_text(json.dumps(rep, indent=1))
    return rep


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    ap.add_argument("--gpus", type=int, default=0, help="default: the GPUs torch sees")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--so", type=Path, required=True, help="the plugin .so")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(SIZES))
    ap.add_argument("--deadline-s", type=float, default=900.0, help="per rank count")
    args = ap.parse_args(argv)
    gpus = args.gpus or gpu_test.gpu_count()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    reports = []
    for world in args.ranks:
        rep = run_world(
            world, gpus, args.sizes, args.so.resolve(), args.out, deadline_s=args.deadline_s
        )
        reports.append(rep)
        print(
            f"gpu-sweep: {world} ranks: NCCL {rep['nccl_version']}, "
            f"{rep['forced_points_confirmed']}/{rep['forced_points_tried']} forced points "
            f"confirmed, {len(rep['nccl_losses'])} cells where NCCL's pick loses; "
            f"{rep['segments_done']}/{rep['segments_planned']} segments",
            flush=True,
        )
    (args.out / "sweep.json").write_text(json.dumps(reports, indent=1))
    return 0 if all(r["forced_points_confirmed"] and not r["mixed"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())

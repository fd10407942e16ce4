"""What DynamICCL's profiler adds to a collective call: v6 path against v7 path (issue 30).

Reproduce:  make -C plugin bench-profiler   (or: .venv/bin/python benchmarks/profiler_overhead.py)

The real .so is driven by plugin/bench/bench_profiler.c with the events DynamICCL subscribes to,
for a 128 KiB all-reduce shaped as documented in docs/simulator.md (row `h200-ar-128k`: 8x H200,
NCCL's Ring/LL on 4 channels, 40.0 us measured):

* v6: Coll + KernelCh (mask 0x42): 2 + 3 x channels callbacks per call;
* v7: the same events through profiler v7, which also reads the call's userTag (mask 0x42; kernel
  phases are opt-in);
* v7sym: a symmetric kernel with DYNAMICCL_KERNEL_PHASES=1 (the opt-in), + 3 KernelPhase events
  x 3 callbacks per channel. Its budget verdict is reported; the exit status covers the default
  subscriptions (v6, v7) only.

ns per call: the fastest of 15 repetitions (the least disturbed by other work on a shared
machine; the median is printed too), minus the same loop through empty functions (baseline,
same run). Instructions per call: the CPU's counter through perf_event_open where the kernel
allows it, else callgrind (`--toggle-collect=loop`), minus the baseline's. The share is the
plugin's time per call over the collective's documented time (an upper bound: the callbacks run
on host threads, off the GPU's path unless the host is the bottleneck). Budget: <= 1 %.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "plugin" / "build"
SO = BUILD / "libnccl-tuner-dynamiccl.so"
BENCH = BUILD / "bench_profiler"
SIM_DOC = ROOT / "docs" / "simulator.md"
ROW = "h200-ar-128k"
MODES = ("base", "v6", "v7", "v7sym")
N_TIME = 20_000
N_CALLGRIND = 2_000
BUDGET = 0.01


def documented_allreduce() -> tuple[float, int]:
    """(measured us, channels) of the 128 KiB all-reduce row of docs/simulator.md."""
    for line in SIM_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == ROW:
            nch = int(cells[4].split("/")[-1])
            return float(cells[5]), nch
    raise RuntimeError(f"{SIM_DOC}: no row {ROW}")


def _run(mode: str, nch: int, n: int, prefix: list[str] | None = None) -> dict[str, Any]:
    cmd = [*(prefix or []), str(BENCH), str(SO), str(nch), mode, str(n)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _callgrind_instructions(mode: str, nch: int) -> float:
    out_file = BUILD / f"callgrind.profiler.{mode}.out"
    prefix = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        "--toggle-collect=loop*",  # GCC may name the clone loop.isra.0
    ]
    _run(mode, nch, N_CALLGRIND, prefix)
    m = re.search(r"^summary:\s*(\d+)", out_file.read_text(), re.M)
    if not m:
        raise RuntimeError(f"no callgrind summary in {out_file}")
    return int(m.group(1)) / (16 * N_CALLGRIND)  # warm-up + 15 timed loops; perf loop not toggled


def measure() -> dict[str, Any]:
    """Run every mode; the plugin's cost per call and per event, and its share of the call."""
    make = ["make", "-s", "-C", str(ROOT / "plugin"), "all", "build/bench_profiler"]
    subprocess.run(make, check=True)
    t_us, nch = documented_allreduce()
    raw = {m: _run(m, nch, N_TIME) for m in MODES}
    counter = "perf_event_open"
    if raw["base"]["instructions_per_call"] is None:
        counter = f"callgrind (perf_event_open refused: errno {raw['base']['perf_errno']})"
        for m in MODES:
            raw[m]["instructions_per_call"] = _callgrind_instructions(m, nch)
    base = raw["base"]
    out: dict[str, Any] = {
        "collective": {"row": ROW, "source": "docs/simulator.md", "time_us": t_us, "channels": nch},
        "instruction_counter": counter,
        "modes": {},
    }
    for m in MODES[1:]:
        r = raw[m]
        ns = r["ns_per_call"] - base["ns_per_call"]
        median = r["median_ns_per_call"] - base["median_ns_per_call"]
        ins = r["instructions_per_call"] - base["instructions_per_call"]
        ev = r["events_per_call"]
        share = ns / (t_us * 1000.0)
        out["modes"][m] = {
            "mask": r["mask"],
            "events_per_call": ev,
            "ns_per_call": round(ns, 1),
            "median_ns_per_call": round(median, 1),
            "ns_per_event": round(ns / ev, 2),
            "instructions_per_call": round(ins, 1),
            "instructions_per_event": round(ins / ev, 1),
            "calls_per_second_per_core": round(1e9 / ns) if ns > 0 else None,
            "share_of_128k_allreduce_pct": round(100 * share, 3),
            "within_budget": share <= BUDGET,
        }
    return out


def main() -> int:
    report = measure()
    print(json.dumps(report, indent=2))
    default = (report["modes"][m] for m in ("v6", "v7"))
    return 0 if all(m["within_budget"] for m in default) else 1


if __name__ == "__main__":
    sys.exit(main())

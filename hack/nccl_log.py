"""NCCL's INFO log (NCCL_DEBUG=INFO) read into facts: version, plugins, communicators, choices.

Pure: text in, `NcclLog` out; any text parses (an unknown line is skipped, never an error).
The line formats are NCCL's (read in NCCL's sources, v2.27..v2.30.7, facts only):

- every line: `[timestamp ]host:pid:tid [cudaDev] NCCL INFO <message>` (`NCCL WARN` for
  warnings; `src/debug.cc`); on one GPU every rank logs `[0]`, so a log file is per rank;
- `NCCL version 2.30.7+cuda13.0` (`src/init.cc`, showVersion);
- `TUNER/Plugin: Using <name> (v<N>)` (2.28+, `src/plugin/tuner/tuner_v<N>.cc`),
  `Using tuner plugin <name>` (2.27); `PROFILER/Plugin: Loaded <name> (v<N>)` (2.28+),
  `loaded <name>` (2.27);
- `comm <ptr> rank R nRanks N nNodes K localRanks L localRank l MNNVL m` (`src/init.cc`);
- `C coll channels, ...` (`src/init.cc`), `Using network <name>` (`src/init.cc`);
- rank 0, one line per collective task: `<Func>: <bytes> Bytes -> Algo <ALGO> proto <PROTO>
  channel{Lo..Hi}={lo..hi}` (`src/enqueue.cc`; bytes = count x type size: for all-gather
  and reduce-scatter one rank's part); `<Func>: tuner chunk size C exceeds buffer max M,
  clamping` (2.30, when a v6 tuner's getChunkSize asked for more than the buffer holds);
- `NCCL_HOSTID set by environment to <id>` (`src/misc/utils.cc`);
- the plugin's own lines through NCCL's logger: `DynamICCL: ...` (plugin/src).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_INFO = re.compile(r"NCCL (INFO|WARN) (.*)$")
_VERSION = re.compile(r"^NCCL version (\d+)\.(\d+)\.(\d+)(\S*)")
_TUNER = re.compile(r"^TUNER/Plugin: Using (?:tuner plugin )?(\S+?)(?: \(v(\d+)\))?$")
_PROFILER = re.compile(r"^PROFILER/Plugin: [Ll]oaded (\S+?)(?: \(v(\d+)\))?$")
_COMM = re.compile(
    r"^comm (\S+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)"
)
_CHANNELS = re.compile(r"^(\d+) coll channels, ")
_NETWORK = re.compile(r"^Using network (\S+)")
_TUNING = re.compile(
    r"^(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?"
)
_CLAMP = re.compile(r"^(\w+): tuner chunk size (\d+) exceeds buffer max (\d+), clamping")
_HOSTID = re.compile(r"^NCCL_HOSTID set by environment to (.+)$")
PLUGIN_PREFIX = "DynamICCL: "


def norm(name: str) -> str:
    """NCCL's spelling of an algorithm/protocol (RING, NVLS_TREE, NVLSTree, Simple) -> ours."""
    n = name.lower().replace("_", "")
    return {
        "nvlstree": "nvls_tree",
        "collnetdirect": "collnet_direct",
        "collnetchain": "collnet_chain",
    }.get(n, n)


@dataclass(frozen=True)
class Plugin:
    """A plugin NCCL loaded: its name and the ABI version NCCL picked (0: not printed, 2.27)."""

    name: str
    abi: int


@dataclass(frozen=True)
class Comm:
    """One communicator as NCCL set it up on this rank."""

    rank: int
    nranks: int
    nnodes: int
    local_ranks: int


@dataclass(frozen=True)
class Tuning:
    """What NCCL ran for one collective task (rank 0's TUNING line)."""

    func: str  # NCCL's name: AllReduce, AllGather, ReduceScatter, ...
    count_bytes: int  # count x type size
    algo: str  # ours: ring, tree, pat, nvls, ...
    proto: str  # ll, ll128, simple
    nchannels: int  # hi - lo + 1; 0 when the line has no channel range


@dataclass(frozen=True)
class Clamp:
    """A v6 tuner's chunk size that NCCL clamped to its buffer (proof getChunkSize was used)."""

    func: str
    asked: int
    max_bytes: int


@dataclass
class NcclLog:
    """Everything this module reads from one rank's log."""

    version: tuple[int, int, int] | None = None
    version_text: str = ""
    tuner: Plugin | None = None
    profiler: Plugin | None = None
    comms: list[Comm] = field(default_factory=list)
    coll_channels: int | None = None
    network: str = ""
    hostid: str = ""
    tuning: list[Tuning] = field(default_factory=list)
    clamps: list[Clamp] = field(default_factory=list)
    plugin_lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _abi(text: str | None) -> int:
    return int(text) if text else 0


def _one(out: NcclLog, msg: str) -> None:
    if m := _TUNING.match(msg):
        nch = int(m[6]) - int(m[5]) + 1 if m[5] is not None else 0
        out.tuning.append(Tuning(m[1], int(m[2]), norm(m[3]), norm(m[4]), nch))
        return
    if msg.startswith(PLUGIN_PREFIX):
        out.plugin_lines.append(msg[len(PLUGIN_PREFIX) :])
        return
    if m := _CLAMP.match(msg):
        out.clamps.append(Clamp(m[1], int(m[2]), int(m[3])))
        return
    if m := _VERSION.match(msg):
        out.version = (int(m[1]), int(m[2]), int(m[3]))
        out.version_text = m[0][len("NCCL version ") :]
        return
    if m := _TUNER.match(msg):
        out.tuner = Plugin(m[1], _abi(m[2]))
        return
    if m := _PROFILER.match(msg):
        out.profiler = Plugin(m[1], _abi(m[2]))
        return
    if m := _COMM.match(msg):
        out.comms.append(Comm(int(m[2]), int(m[3]), int(m[4]), int(m[5])))
        return
    if m := _CHANNELS.match(msg):
        out.coll_channels = int(m[1])
        return
    if m := _NETWORK.match(msg):
        out.network = m[1]
        return
    if m := _HOSTID.match(msg):
        out.hostid = m[1].strip()


def parse(lines: Iterable[str]) -> NcclLog:
    """The facts of one rank's NCCL log (lines in the order NCCL wrote them)."""
    out = NcclLog()
    for line in lines:
        m = _INFO.search(line.rstrip("\n"))
        if m is None:
            continue
        if m[1] == "WARN":
            out.warnings.append(m[2])
        else:
            _one(out, m[2])
    return out


def tuning_by_call(log: NcclLog) -> dict[tuple[str, int], list[Tuning]]:
    """Rank 0's TUNING lines per (function, count bytes), in call order."""
    out: dict[tuple[str, int], list[Tuning]] = {}
    for t in log.tuning:
        out.setdefault((t.func, t.count_bytes), []).append(t)
    return out

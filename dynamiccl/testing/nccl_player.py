"""The one NCCL player of tests, benchmarks and the demo: NCCL against the real plugin ``.so``.

It calls ``getCollInfo`` of any exported tuner version (v2..v6) with cost tables
shaped like NCCL's (``float[7][3]``, ``-1.0`` = unavailable), reads back what
NCCL would then pick (and v6's ``getChunkSize``), and drives the profiler ABI
(v4..v7): a ``Coll`` event with ``KernelCh`` children carrying GPU timestamps
(v7: the call's user tag, and ``KernelPhase`` children of each channel for
symmetric kernels). `play_call` is one collective as NCCL runs it (every
player of the project goes through it); `play` a sequence of them. Execution
times come from the caller (`TimeFn`, or `ChoiceTimeFn` with the plugin's raw
channel count and chunk size).
"""

from __future__ import annotations

import ctypes as ct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from dynamiccl.api.nccl import NUM_ALGORITHMS, NUM_PROTOCOLS
from dynamiccl.sidecar.ctypes_abi import (
    IGNORE,
    PROFILER_VERSIONS,
    TUNER_VERSIONS,
    P,
    Plugin,
    default_so,
)
from dynamiccl.testing.nccl_profiler import ProfiledComm

__all__ = [
    "IGNORE",
    "NO_PROFILER",
    "PROFILER_VERSIONS",
    "TUNER_VERSIONS",
    "Choice",
    "CollInfo",
    "Comm",
    "Played",
    "Plugin",
    "ProfiledComm",
    "by_choice",
    "default_so",
    "element_count",
    "nccl_pick",
    "play",
    "play_call",
    "realistic_cost_table",
    "tuning_logs",
]

NO_PROFILER = "no DynamICCL profiler loaded"  # the tuner's notice when NCCL loaded no profiler

TimeFn = Callable[[int, int, int, int, int], float]
CostTable = list[list[float]]


def nccl_pick(cost: Sequence[Sequence[float]]) -> tuple[int, int] | None:
    """(algo, proto) NCCL selects from a cost table: the smallest non-negative entry."""
    best: tuple[float, int, int] | None = None
    for a, row in enumerate(cost):
        for p, v in enumerate(row):
            if v >= 0.0 and (best is None or v < best[0]):
                best = (v, a, p)
    return None if best is None else (best[1], best[2])


@dataclass(frozen=True)
class CollInfo:
    """What one getCollInfo call did: the cost table after the call and NCCL's resulting pick."""

    cost: CostTable
    nchannels: int
    algo: int
    proto: int


def realistic_cost_table(
    coll: int,
    nbytes: int,
    nranks: int,
    nnodes: int,
    *,
    nvls: bool = False,
    collnet: bool = False,
    pat: bool = False,
) -> CostTable:
    """A cost table in NCCL's shape: latency + size / bandwidth (us), -1.0 where unavailable."""
    lat = (
        (6.8, 14.0, 8.4),
        (6.6, 14.0, 8.4),
        (0.0, 0.0, 14.0),
        (0.0, 0.0, 14.0),
        (0.0, 0.0, 25.0),
        (0.0, 0.0, 25.0),
        (8.0, 14.0, 8.4),
    )
    bw = (0.5, 0.9, 1.0)  # relative protocol efficiency
    table: CostTable = [[IGNORE] * NUM_PROTOCOLS for _ in range(NUM_ALGORITHMS)]
    steps = max(nranks - 1, 1)
    for p in range(NUM_PROTOCOLS):
        table[1][p] = lat[1][p] * steps / 4 + nbytes / (20_000.0 * bw[p])
        if coll == 4:
            table[0][p] = lat[0][p] * max(nnodes, 2) + nbytes / (16_000.0 * bw[p])
        if pat and coll in (2, 3) and nnodes > 1:
            table[6][p] = lat[6][p] * 2 + nbytes / (12_000.0 * bw[p])
    if collnet and coll == 4 and nnodes > 1:
        table[2][2] = lat[2][2] + nbytes / 30_000.0
        table[3][2] = lat[3][2] + nbytes / 28_000.0
    if nvls and coll in (2, 3, 4):
        table[4][2] = lat[4][2] + nbytes / 40_000.0
        if coll == 4 and nnodes > 1:
            table[5][2] = lat[5][2] + nbytes / 35_000.0
    return table


@dataclass
class Comm:
    """One communicator as NCCL drives the tuner: init, getCollInfo per collective, finalize."""

    plugin: Plugin
    version: int
    nranks: int
    nnodes: int
    comm_id: int = 0
    ctx: ct.c_void_p = field(default_factory=ct.c_void_p)

    def __post_init__(self) -> None:
        self._t = self.plugin.tuner(self.version)
        if self.version >= 5:
            rc = self._t.init(
                ct.byref(self.ctx),
                self.comm_id,
                self.nranks,
                self.nnodes,
                self.plugin.logger,
                None,
                None,
            )
        else:
            rc = self._t.init(self.nranks, self.nnodes, self.plugin.logger, ct.byref(self.ctx))
        if rc != 0:
            raise RuntimeError(f"tuner v{self.version} init returned {rc}")
        self._cost = (ct.c_float * (NUM_ALGORITHMS * NUM_PROTOCOLS))()
        self._nch = ct.c_int(0)

    def repeat(self, coll: int, nbytes: int, cost: CostTable, n: int) -> list[tuple[int, int, int]]:
        """`n` getCollInfo calls (v3+) with the same `cost` (the fast path of long runs): per
        call, the (algo, proto, nChannels) NCCL then runs (nChannels 0: NCCL's own count)."""
        if self.version < 3:
            raise ValueError("repeat() drives tuner v3 and later")
        flat, nch = self._cost, self._nch
        for a in range(NUM_ALGORITHMS):
            for p in range(NUM_PROTOCOLS):
                flat[a * NUM_PROTOCOLS + p] = cost[a][p]
        template = bytes(flat)
        size = len(template)
        args = [self.ctx, coll, nbytes, 1, ct.cast(flat, P), NUM_ALGORITHMS, NUM_PROTOCOLS]
        args += [0] if self.version >= 4 else []
        args.append(ct.byref(nch))
        call = self._t.getCollInfo
        seen: dict[tuple[bytes, int], tuple[int, int, int]] = {}
        out = []
        for _ in range(n):
            ct.memmove(flat, template, size)
            nch.value = 0
            call(*args)
            key = (bytes(flat), nch.value)
            got = seen.get(key)
            if got is None:
                table = [
                    list(flat[a * NUM_PROTOCOLS : (a + 1) * NUM_PROTOCOLS])
                    for a in range(NUM_ALGORITHMS)
                ]
                pick = nccl_pick(table) or (-1, -1)
                got = seen[key] = (pick[0], pick[1], nch.value)
            out.append(got)
        return out

    def get_coll_info(
        self, coll: int, nbytes: int, cost: CostTable, *, num_pipe_ops: int = 1, reg_buff: int = 0
    ) -> CollInfo:
        """Call getCollInfo with `cost` (NCCL pre-fills nChannels with 0); returns the result."""
        self._nch.value = 0
        if self.version == 2:
            return self._v2(coll, nbytes, cost, num_pipe_ops)
        flat = self._cost
        for a in range(NUM_ALGORITHMS):
            for p in range(NUM_PROTOCOLS):
                flat[a * NUM_PROTOCOLS + p] = cost[a][p]
        args = [
            self.ctx,
            coll,
            nbytes,
            num_pipe_ops,
            ct.cast(flat, P),
            NUM_ALGORITHMS,
            NUM_PROTOCOLS,
        ]
        if self.version >= 4:
            args.append(reg_buff)
        rc = self._t.getCollInfo(*args, ct.byref(self._nch))
        if rc != 0:
            raise RuntimeError(f"getCollInfo returned {rc}")
        out = [
            [flat[a * NUM_PROTOCOLS + p] for p in range(NUM_PROTOCOLS)]
            for a in range(NUM_ALGORITHMS)
        ]
        pick = nccl_pick(out) or (-1, -1)
        return CollInfo(out, self._nch.value, pick[0], pick[1])

    def _v2(self, coll: int, nbytes: int, cost: CostTable, num_pipe_ops: int) -> CollInfo:
        # NCCL's v2 adapter derives the support flags from the cost table, then forces the answer.
        nvls = int(cost[4][2] != IGNORE or cost[5][2] != IGNORE)
        collnet = int(cost[3][2] != IGNORE)
        algo, proto = ct.c_int(-1), ct.c_int(-1)
        rc = self._t.getCollInfo(
            self.ctx,
            coll,
            nbytes,
            collnet,
            nvls,
            num_pipe_ops,
            ct.byref(algo),
            ct.byref(proto),
            ct.byref(self._nch),
        )
        if rc != 0:
            raise RuntimeError(f"getCollInfo v2 returned {rc}")
        out = [list(row) for row in cost]
        a, p = algo.value, proto.value
        if 0 <= a < NUM_ALGORITHMS and 0 <= p < NUM_PROTOCOLS and out[a][p] != IGNORE:
            out[a][p] = 0.0
        pick = nccl_pick(out) or (-1, -1)
        return CollInfo(out, self._nch.value, pick[0], pick[1])

    def chunk_size(  # noqa: PLR0917 -- mirrors getChunkSize
        self, coll: int, nbytes: int, algo: int, proto: int, nchannels: int, nccl_chunk: int
    ) -> int:
        """v6 getChunkSize: NCCL's chunk size in, the plugin's answer out.

        Real NCCL (2.30) calls it only after all of a group's getCollInfo calls, per task and
        channel range, with one channel's bytes and nchannels=1 (the whole task and its channel
        count for CollNet); tests/unit/plugin/test_plugin_nccl_order.py plays that order."""
        val = ct.c_size_t(nccl_chunk)
        rc = self._t.getChunkSize(self.ctx, coll, nbytes, algo, proto, nchannels, ct.byref(val))
        if rc != 0:
            raise RuntimeError(f"getChunkSize returned {rc}")
        return int(val.value)

    def finalize(self) -> None:
        """destroy / finalize the context."""
        self._t.finalize(self.ctx)


@dataclass(frozen=True)
class Choice:
    """What NCCL runs for one call after the tuner: algorithm, protocol, channels, chunk."""

    coll: int
    nbytes: int
    algo: int
    proto: int
    nchannels: int  # the channels that run (NCCL's own count where the plugin left 0)
    plugin_channels: int  # the plugin's answer (0: NCCL's own count)
    chunk: int  # getChunkSize's answer (0: not asked)


@dataclass(frozen=True)
class Played:
    """One collective as the player played it: NCCL's resulting choice and its GPU time."""

    coll: int
    nbytes: int
    algo: int
    proto: int
    nchannels: int
    time_us: float
    exec_ns: int
    plugin_channels: int = 0
    chunk: int = 0


ChoiceTimeFn = Callable[[Choice], float]
ChannelsFn = Callable[[int, int, int, int], int]  # (collective, nbytes, algo, proto) -> channels


def by_choice(time_fn: TimeFn) -> ChoiceTimeFn:
    """A `TimeFn` of (collective, nbytes, algo, proto, nchannels) as a `ChoiceTimeFn`."""
    return lambda ch: time_fn(ch.coll, ch.nbytes, ch.algo, ch.proto, ch.nchannels)


def element_count(coll: int, nbytes: int, nranks: int) -> int:
    """The element count the profiler reports (float32; per rank for AllGather/ReduceScatter)."""
    per_rank = nranks if coll in (2, 3) else 1
    return max(nbytes // (4 * per_rank), 1)


def play_call(  # noqa: PLR0917 -- one collective's inputs, as NCCL has them
    comm: Comm,
    coll: int,
    nbytes: int,
    cost: CostTable,
    time_of: ChoiceTimeFn,
    profiler: ProfiledComm | None = None,
    *,
    channels: int | ChannelsFn = 8,
    chunk: bool = False,
) -> Played:
    """One collective as NCCL runs it: getCollInfo with `cost`, NCCL's pick, (`chunk`:
    getChunkSize after the choice, as NCCL 2.27+), the time `time_of` gives the choice, and
    the profiler's events with that GPU time. `channels`: NCCL's count where the plugin left 0
    (a number, or a function of collective, nbytes, algo, proto)."""
    info = comm.get_coll_info(coll, nbytes, cost)
    a, p = info.algo, info.proto
    nch = info.nchannels or (
        channels if isinstance(channels, int) else channels(coll, nbytes, a, p)
    )
    size = comm.chunk_size(coll, nbytes, a, p, nch, 0) if chunk else 0
    t = time_of(Choice(coll, nbytes, a, p, nch, info.nchannels, size))
    exec_ns = 0
    if profiler is not None:
        count = element_count(coll, nbytes, comm.nranks)
        exec_ns = profiler.collective(coll, count, b"ncclFloat32", a, p, nch, t)
    return Played(coll, nbytes, a, p, nch, t, exec_ns, info.nchannels, size)


def play(
    comm: Comm,
    calls: Iterable[tuple[int, int]],
    time_fn: TimeFn,
    *,
    profiler: ProfiledComm | None = None,
    cost_fn: Callable[[int, int], CostTable] | None = None,
    default_channels: int = 8,
) -> list[Played]:
    """Play NCCL for `calls` of (collective, nbytes) through `play_call`.

    The cost table comes from `cost_fn` (default: `realistic_cost_table` for the communicator's
    shape); the execution time from `time_fn(collective, nbytes, algo, proto, nchannels)` in us;
    `nchannels` is NCCL's default (`default_channels`) when the plugin left it at 0.
    """
    cost = cost_fn or (lambda c, n: realistic_cost_table(c, n, comm.nranks, comm.nnodes))
    time_of = by_choice(time_fn)
    return [
        play_call(
            comm, coll, nbytes, cost(coll, nbytes), time_of, profiler, channels=default_channels
        )
        for coll, nbytes in calls
    ]


def tuning_logs(plugin: Plugin) -> list[str]:
    """The plugin's log lines except the tuner's "no profiler loaded" notice."""
    return [m for _, m in plugin.logs if NO_PROFILER not in m]

"""A harness that plays NCCL against the real plugin ``.so`` (ctypes).

It calls ``getCollInfo`` of any exported tuner version (v2..v6) with cost tables
shaped like NCCL's (``float[7][3]``, ``-1.0`` = unavailable), reads back what
NCCL would then pick, and drives the profiler ABI (v4..v7): a ``Coll`` event
with ``KernelCh`` children carrying GPU timestamps (v7: the call's user tag, and
``KernelPhase`` children of each channel for symmetric kernels).  Execution times come from
a caller-supplied ``(collective, nbytes, algo, proto, nchannels) -> time_us``.
"""

from __future__ import annotations

import ctypes as ct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from dynamiccl.agent.ctypes_abi import (
    ALGO_NAMES,
    FUNC_NAMES,
    IGNORE,
    KERNEL_CH_STOP,
    KERNEL_PHASE_STOP,
    KERNEL_PHASES,
    PROFILE_COLL,
    PROFILE_KERNEL_CH,
    PROFILE_KERNEL_PHASE,
    PROFILER_VERSIONS,
    PROTO_NAMES,
    TUNER_VERSIONS,
    P,
    Plugin,
    StateArgs,
    default_so,
    descriptor_type,
)
from dynamiccl.api.nccl import NUM_ALGORITHMS, NUM_PROTOCOLS

__all__ = [
    "IGNORE",
    "PROFILER_VERSIONS",
    "TUNER_VERSIONS",
    "CollInfo",
    "Comm",
    "Plugin",
    "ProfiledComm",
    "default_so",
    "nccl_pick",
    "play",
    "realistic_cost_table",
]

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


@dataclass
class ProfiledComm:
    """One communicator as NCCL drives the profiler: Coll events with KernelCh children."""

    plugin: Plugin
    version: int
    nranks: int
    nnodes: int
    comm_id: int = 0
    rank: int = 0
    ctx: ct.c_void_p = field(default_factory=ct.c_void_p)
    mask: int = 0
    gpu_clock_ns: int = 1_000_000

    def __post_init__(self) -> None:
        self._p = self.plugin.profiler(self.version)
        m = ct.c_int(0)
        if self.version == 4:
            rc = self._p.init(
                ct.byref(self.ctx),
                ct.byref(m),
                b"comm",
                self.comm_id,
                self.nnodes,
                self.nranks,
                self.rank,
                self.plugin.logger,
            )
        else:
            rc = self._p.init(
                ct.byref(self.ctx),
                self.comm_id,
                ct.byref(m),
                b"comm",
                self.nnodes,
                self.nranks,
                self.rank,
                self.plugin.logger,
            )
        if rc != 0:
            raise RuntimeError(f"profiler v{self.version} init returned {rc}")
        self.mask = m.value
        self._descr = descriptor_type(self.version)
        self._seq = 0

    def collective(  # noqa: PLR0917
        self,
        coll: int,
        count: int,
        datatype: bytes,
        algo: int,
        proto: int,
        nchannels: int,
        time_us: float,
        *,
        user_tag: int = 0,
        variant: bytes | None = None,
        phases_ns: Sequence[int] = (),
    ) -> int:
        """Start a Coll event, one KernelCh per channel spanning `time_us` of GPU time, stop all.

        v7 only: `user_tag` is the call's tag; `variant` names a symmetric kernel (isSymColl);
        `phases_ns` are the durations of the kernel phases NCCL reports per channel, in NCCL's
        order (each phase started, stopped and ended before its channel's stop).
        Returns the GPU execution time in ns the plugin should report (max over channels)."""
        d = self._descr()
        d.type, d.rank = PROFILE_COLL, self.rank
        d.coll.seqNumber, d.coll.func, d.coll.count = self._seq, FUNC_NAMES[coll].encode(), count
        d.coll.datatype, d.coll.nChannels, d.coll.nWarps = datatype, nchannels, 16
        d.coll.algo, d.coll.proto = ALGO_NAMES[algo].encode(), PROTO_NAMES[proto].encode()
        if self.version >= 7:
            d.coll.userTag, d.coll.kernelVariant = user_tag, variant
            d.coll.isSymColl = bool(variant)
        self._seq += 1
        handle = P()
        self._p.startEvent(self.ctx, ct.byref(handle), ct.byref(d))
        self._p.stopEvent(handle)  # NCCL stops the Coll event once enqueued, before the kernels
        longest = 0
        handles = []
        for ch in range(nchannels):  # the profiler thread sees each channel start...
            kd = self._descr()
            kd.type, kd.parentObj, kd.rank = PROFILE_KERNEL_CH, handle, self.rank
            kd.kernelCh.channelId, kd.kernelCh.pTimer = ch, self.gpu_clock_ns + 7 * ch
            kh = P()
            self._p.startEvent(self.ctx, ct.byref(kh), ct.byref(kd))
            handles.append(kh)
        for ch, kh in enumerate(handles):  # ...and later its phases (v7), then its stop
            self._phases(kh, ch, self.gpu_clock_ns + 7 * ch, phases_ns)
            dur = int(time_us * 1000) - 3 * ch
            args = StateArgs(pTimer=self.gpu_clock_ns + 7 * ch + dur)
            self._p.recordEventState(kh, KERNEL_CH_STOP, ct.byref(args))
            self._p.stopEvent(kh)
            longest = max(longest, dur)
        self.gpu_clock_ns += int(time_us * 1000) + 1000
        return longest

    def _phases(self, parent: P, ch: int, t: int, phases_ns: Sequence[int]) -> None:
        for i, dur in enumerate(phases_ns):
            pd = self._descr()
            pd.type, pd.parentObj, pd.rank = PROFILE_KERNEL_PHASE, parent, self.rank
            pd.kernelPhase.channelId, pd.kernelPhase.phaseId, pd.kernelPhase.pTimer = ch, i, t
            pd.kernelPhase.phaseName = KERNEL_PHASES[i].encode()
            ph = P()
            self._p.startEvent(self.ctx, ct.byref(ph), ct.byref(pd))
            t += dur
            self._p.recordEventState(ph, KERNEL_PHASE_STOP, ct.byref(StateArgs(pTimer=t)))
            self._p.stopEvent(ph)

    def finalize(self) -> None:
        """finalize the profiler context."""
        self._p.finalize(self.ctx)


@dataclass(frozen=True)
class Played:
    """One collective as the harness played it: NCCL's resulting choice and its GPU time."""

    coll: int
    nbytes: int
    algo: int
    proto: int
    nchannels: int
    time_us: float
    exec_ns: int


def play(
    comm: Comm,
    calls: Iterable[tuple[int, int]],
    time_fn: TimeFn,
    *,
    profiler: ProfiledComm | None = None,
    cost_fn: Callable[[int, int], CostTable] | None = None,
    default_channels: int = 8,
) -> list[Played]:
    """Play NCCL for `calls` of (collective, nbytes): tune, pick, time, profile.

    The cost table comes from `cost_fn` (default: `realistic_cost_table` for the communicator's
    shape); the execution time from `time_fn(collective, nbytes, algo, proto, nchannels)` in us;
    `nchannels` is NCCL's default (`default_channels`) when the plugin left it at 0.
    """
    out = []
    for coll, nbytes in calls:
        cost = (cost_fn or (lambda c, n: realistic_cost_table(c, n, comm.nranks, comm.nnodes)))(
            coll, nbytes
        )
        info = comm.get_coll_info(coll, nbytes, cost)
        nch = info.nchannels or default_channels
        t = time_fn(coll, nbytes, info.algo, info.proto, nch)
        exec_ns = 0
        if profiler is not None:
            per_rank = comm.nranks if coll in (2, 3) else 1  # the profiler reports per-rank counts
            count = max(nbytes // (4 * per_rank), 1)
            exec_ns = profiler.collective(
                coll, count, b"ncclFloat32", info.algo, info.proto, nch, t
            )
        out.append(Played(coll, nbytes, info.algo, info.proto, nch, t, exec_ns))
    return out

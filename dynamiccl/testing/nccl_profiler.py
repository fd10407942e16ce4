"""NCCL's profiler side of the player: a communicator's Coll events with KernelCh children.

`ProfiledComm` drives the profiler ABI (v4..v7) of the real plugin ``.so`` as NCCL
does: a ``Coll`` event per collective, stopped once enqueued, then one ``KernelCh``
child per channel with GPU timestamps (v7: the user tag, and ``KernelPhase``
children for symmetric kernels). Used through `dynamiccl.testing.nccl_player`.
"""

from __future__ import annotations

import ctypes as ct
from collections.abc import Sequence
from dataclasses import dataclass, field

from dynamiccl.sidecar.ctypes_abi import (
    ALGO_NAMES,
    FUNC_NAMES,
    KERNEL_CH_STOP,
    KERNEL_PHASE_STOP,
    KERNEL_PHASES,
    PROFILE_COLL,
    PROFILE_KERNEL_CH,
    PROFILE_KERNEL_PHASE,
    PROTO_NAMES,
    P,
    Plugin,
    StateArgs,
    descriptor_type,
)


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

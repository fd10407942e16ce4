"""ctypes declarations of NCCL's tuner (v2..v7) and profiler (v4..v7) plugin ABI, and the loader.

Layouts mirror ``plugin/include/dyn_nccl_abi.h``; ``tests/unit/sidecar/test_ctypes_abi.py``
checks the offsets the plugin relies on.
"""

from __future__ import annotations

import ctypes as ct
import os
from pathlib import Path
from typing import Final

from dynamiccl.constants import ENV_PLUGIN_SO

IGNORE: Final = -1.0
TUNER_VERSIONS: Final = (2, 3, 4, 5, 6, 7)
PROFILER_VERSIONS: Final = (4, 5, 6, 7)
PROFILE_COLL: Final = 1 << 1
PROFILE_KERNEL_CH: Final = 1 << 6
PROFILE_KERNEL_PHASE: Final = 1 << 15  # v7
KERNEL_CH_STOP: Final = 22
KERNEL_PHASE_STOP: Final = 31  # v7: the stop timestamp rides in the state args' kernelCh.pTimer
KERNEL_PHASES: Final = ("initial_sync", "compute", "final_sync")  # v7 phaseId 0, 1, 2
FUNC_NAMES: Final = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
ALGO_NAMES: Final = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTO_NAMES: Final = ("LL", "LL128", "SIMPLE")


def default_so() -> Path:
    """$DYNAMICCL_PLUGIN_SO, else plugin/build/libnccl-tuner-dynamiccl.so of this checkout."""
    env = os.environ.get(ENV_PLUGIN_SO)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "plugin" / "build" / "libnccl-tuner-dynamiccl.so"


LOGGER = ct.CFUNCTYPE(None, ct.c_int, ct.c_ulong, ct.c_char_p, ct.c_int, ct.c_char_p, ct.c_char_p)
P = ct.c_void_p
_INIT_V2 = ct.CFUNCTYPE(ct.c_int, ct.c_size_t, ct.c_size_t, LOGGER, ct.POINTER(P))
_INIT_V5 = ct.CFUNCTYPE(
    ct.c_int, ct.POINTER(P), ct.c_uint64, ct.c_size_t, ct.c_size_t, LOGGER, P, P
)
_GCI_V2 = ct.CFUNCTYPE(
    ct.c_int,
    P,
    ct.c_int,
    ct.c_size_t,
    ct.c_int,
    ct.c_int,
    ct.c_int,
    ct.POINTER(ct.c_int),
    ct.POINTER(ct.c_int),
    ct.POINTER(ct.c_int),
)
_GCI_V3 = ct.CFUNCTYPE(
    ct.c_int, P, ct.c_int, ct.c_size_t, ct.c_int, P, ct.c_int, ct.c_int, ct.POINTER(ct.c_int)
)
_GCI_V4 = ct.CFUNCTYPE(
    ct.c_int,
    P,
    ct.c_int,
    ct.c_size_t,
    ct.c_int,
    P,
    ct.c_int,
    ct.c_int,
    ct.c_int,
    ct.POINTER(ct.c_int),
)
_FIN = ct.CFUNCTYPE(ct.c_int, P)
_CHUNK = ct.CFUNCTYPE(
    ct.c_int, P, ct.c_int, ct.c_size_t, ct.c_int, ct.c_int, ct.c_int, ct.POINTER(ct.c_size_t)
)


def _tuner_struct(init: type, gci: type, chunk: bool) -> type[ct.Structure]:
    fields = [("name", ct.c_char_p), ("init", init), ("getCollInfo", gci), ("finalize", _FIN)]
    if chunk:
        fields.append(("getChunkSize", _CHUNK))
    return type("TunerV", (ct.Structure,), {"_fields_": fields})


_TUNER_STRUCTS: Final = {
    2: _tuner_struct(_INIT_V2, _GCI_V2, False),
    3: _tuner_struct(_INIT_V2, _GCI_V3, False),
    4: _tuner_struct(_INIT_V2, _GCI_V4, False),
    5: _tuner_struct(_INIT_V5, _GCI_V4, False),
    6: _tuner_struct(_INIT_V5, _GCI_V4, True),
    7: _tuner_struct(_INIT_V5, _GCI_V4, True),  # v6's callbacks; constants with 5 compcap rows
}


class _Coll(ct.Structure):
    _fields_ = [
        ("seqNumber", ct.c_uint64),
        ("func", ct.c_char_p),
        ("sendBuff", P),
        ("recvBuff", P),
        ("count", ct.c_size_t),
        ("root", ct.c_int),
        ("datatype", ct.c_char_p),
        ("nChannels", ct.c_uint8),
        ("nWarps", ct.c_uint8),
        ("algo", ct.c_char_p),
        ("proto", ct.c_char_p),
        ("parentGroup", P),
    ]


class _CollV7(ct.Structure):
    """v7's coll: v5's fields, then the symmetric kernel's variant, the flag and the user's tag."""

    _fields_ = [
        *_Coll._fields_,
        ("kernelVariant", ct.c_char_p),
        ("isSymColl", ct.c_bool),
        ("userTag", ct.c_uint64),
    ]


class _KernelCh(ct.Structure):
    _fields_ = [("channelId", ct.c_uint8), ("pTimer", ct.c_uint64)]


class _KernelPhase(ct.Structure):
    _fields_ = [
        ("channelId", ct.c_uint8),
        ("phaseId", ct.c_uint8),
        ("phaseName", ct.c_char_p),
        ("pTimer", ct.c_uint64),
    ]


class _DescrUnion(ct.Union):
    _fields_ = [("coll", _Coll), ("kernelCh", _KernelCh), ("pad", ct.c_uint8 * 128)]


class _DescrUnionV7(ct.Union):
    _fields_ = [
        ("coll", _CollV7),
        ("kernelCh", _KernelCh),
        ("kernelPhase", _KernelPhase),
        ("pad", ct.c_uint8 * 128),
    ]


class _DescrV4(ct.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", ct.c_uint8), ("parentObj", P), ("rank", ct.c_int), ("u", _DescrUnion)]


class _DescrV5(ct.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", ct.c_uint64), ("parentObj", P), ("rank", ct.c_int), ("u", _DescrUnion)]


class _DescrV7(ct.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", ct.c_uint64), ("parentObj", P), ("rank", ct.c_int), ("u", _DescrUnionV7)]


class StateArgs(ct.Union):
    _fields_ = [("pTimer", ct.c_uint64), ("pad", ct.c_uint8 * 16)]


_PINIT_V4 = ct.CFUNCTYPE(
    ct.c_int,
    ct.POINTER(P),
    ct.POINTER(ct.c_int),
    ct.c_char_p,
    ct.c_uint64,
    ct.c_int,
    ct.c_int,
    ct.c_int,
    LOGGER,
)
_PINIT_V5 = ct.CFUNCTYPE(
    ct.c_int,
    ct.POINTER(P),
    ct.c_uint64,
    ct.POINTER(ct.c_int),
    ct.c_char_p,
    ct.c_int,
    ct.c_int,
    ct.c_int,
    LOGGER,
)
_PSTART = ct.CFUNCTYPE(ct.c_int, P, ct.POINTER(P), P)
_PSTOP = ct.CFUNCTYPE(ct.c_int, P)
_PRECORD = ct.CFUNCTYPE(ct.c_int, P, ct.c_int, ct.POINTER(StateArgs))


def _profiler_struct(init: type) -> type[ct.Structure]:
    fields = [
        ("name", ct.c_char_p),
        ("init", init),
        ("startEvent", _PSTART),
        ("stopEvent", _PSTOP),
        ("recordEventState", _PRECORD),
        ("finalize", _FIN),
    ]
    return type("ProfilerV", (ct.Structure,), {"_fields_": fields})


class Plugin:
    """The loaded `.so` and the log lines it sent through NCCL's logger."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_so()
        self.lib = ct.CDLL(str(self.path))
        self.logs: list[tuple[int, str]] = []

        def _log(level: int, _flags: int, _file: bytes, _line: int, fmt: bytes, arg: bytes) -> None:
            text = fmt.decode(errors="replace")
            if "%s" in text and arg is not None:
                text = text.replace("%s", arg.decode(errors="replace"), 1)
            self.logs.append((level, text))

        self.logger = LOGGER(_log)

    def tuner(self, version: int) -> ct.Structure:
        """The exported `ncclTunerPlugin_v<version>` struct."""
        return _TUNER_STRUCTS[version].in_dll(self.lib, f"ncclTunerPlugin_v{version}")

    def profiler(self, version: int) -> ct.Structure:
        """The exported `ncclProfiler_v<version>` struct."""
        init = _PINIT_V4 if version == 4 else _PINIT_V5
        return _profiler_struct(init).in_dll(self.lib, f"ncclProfiler_v{version}")


def descriptor_type(version: int) -> type[ct.Structure]:
    """The event descriptor struct of profiler ABI `version` (v4: 8-bit type; v5+: 64-bit)."""
    return {4: _DescrV4, 7: _DescrV7}.get(version, _DescrV5)

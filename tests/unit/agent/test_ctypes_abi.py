"""The ctypes view of NCCL's plugin ABI has the byte layout of NCCL's (and our C) headers."""

from __future__ import annotations

import ctypes as ct

from dynamiccl.agent import ctypes_abi as abi


def test_profiler_descriptor_layout() -> None:
    for version in abi.PROFILER_VERSIONS:
        d = abi.descriptor_type(version)
        assert d.u.offset == 24
    coll = abi._Coll
    offsets = {name: getattr(coll, name).offset for name, *_ in coll._fields_}
    assert offsets == {
        "seqNumber": 0,
        "func": 8,
        "sendBuff": 16,
        "recvBuff": 24,
        "count": 32,
        "root": 40,
        "datatype": 48,
        "nChannels": 56,
        "nWarps": 57,
        "algo": 64,
        "proto": 72,
        "parentGroup": 80,
    }
    assert abi._KernelCh.pTimer.offset == 8
    assert abi.StateArgs.pTimer.offset == 0


def test_function_tables_have_nccls_shape() -> None:
    ptr = ct.sizeof(ct.c_void_p)
    sizes = {v: ct.sizeof(abi._TUNER_STRUCTS[v]) for v in abi.TUNER_VERSIONS}
    assert sizes == {2: 4 * ptr, 3: 4 * ptr, 4: 4 * ptr, 5: 4 * ptr, 6: 5 * ptr}
    assert ct.sizeof(abi._profiler_struct(abi._PINIT_V5)) == 6 * ptr

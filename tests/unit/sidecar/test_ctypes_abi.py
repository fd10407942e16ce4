"""The ctypes view of NCCL's plugin ABI has the byte layout of NCCL's (and our C) headers.

The numbers come from `plugin/tests/test_abi_layout.c`, which asserts them against
`plugin/include/dyn_nccl_abi.h` at compile time (tests/nccl_abi_facts.py runs it).
"""

from __future__ import annotations

import ctypes as ct
from typing import cast

import pytest

from dynamiccl.sidecar import ctypes_abi as abi
from tests.nccl_abi_facts import AbiFacts, nccl_abi_facts

CType = type[ct.Structure] | type[ct.Union]

# The C struct each ctypes declaration mirrors (v6 uses v5's profiler table and descriptor).
TWINS: dict[str, list[CType]] = {
    **{f"dyn_tuner_v{v}_t": [abi._TUNER_STRUCTS[v]] for v in abi.TUNER_VERSIONS},
    "dyn_profiler_v4_t": [abi._profiler_struct(abi._PINIT_V4)],
    "dyn_profiler_v5_t": [abi._profiler_struct(abi._PINIT_V5)],
    "dyn_profiler_v7_t": [abi._profiler_struct(abi._PINIT_V5)],
    "dyn_prof_descr_v4_t": [abi.descriptor_type(4)],
    "dyn_prof_descr_v5_t": [abi.descriptor_type(5), abi.descriptor_type(6)],
    "dyn_prof_coll_v4_t": [abi._Coll],
    "dyn_prof_coll_v5_t": [abi._Coll],
    "dyn_prof_descr_v7_t": [abi.descriptor_type(7)],
    "dyn_prof_coll_v7_t": [abi._CollV7],
    "dyn_prof_kernel_phase_t": [abi._KernelPhase],
    "dyn_prof_kernel_ch_t": [abi._KernelCh],
    "dyn_prof_state_args_t": [abi.StateArgs],
}
# Passed by the harness as NULL or an int, never laid out in Python.
NO_TWIN = {
    "dyn_nvl_domain_info_v5_t",
    "dyn_tuner_constants_v5_t",
    "dyn_tuner_constants_v7_t",
    "dyn_profiler_event_state_t",
}
# ctypes names v2..v4's `destroy` like v5's `finalize` (same slot, same signature), and
# declares the state-args union's `kernelCh.pTimer` as a direct member.
RENAMED = {"destroy": "finalize", "kernelCh.pTimer": "pTimer"}
# Python builds these for the plugin to read: larger than NCCL's is harmless (v4's coll is
# v5's without the trailing parentGroup; the state-args union gets spare room).
AT_LEAST = {"dyn_prof_coll_v4_t", "dyn_prof_state_args_t"}


def _member(cls: CType, name: str) -> tuple[int, type]:
    """(offset, type) of a field, looking into anonymous members as C does."""
    name = RENAMED.get(name, name)
    types = {f[0]: f[1] for f in cls._fields_}
    if name in types:
        return getattr(cls, name).offset, types[name]
    for anon in getattr(cls, "_anonymous_", ()):
        try:
            off, typ = _member(cast(CType, types[anon]), name)
        except KeyError:
            continue
        return getattr(cls, anon).offset + off, typ
    raise KeyError(f"{cls.__name__} has no field {name}")


def _path(cls: CType, path: str) -> tuple[int, int]:
    """(offset, size) of `a.b.c` inside `cls`."""
    offset, typ = 0, cast(type, cls)
    for part in RENAMED.get(path, path).split("."):
        off, typ = _member(cast(CType, typ), part)
        offset += off
    return offset, ct.sizeof(typ)


@pytest.fixture(scope="module")
def facts() -> AbiFacts:
    return nccl_abi_facts()


def _rows(table: dict[str, int]) -> list[tuple[str, str, int]]:
    """`struct.member` keys split into (struct, member, number)."""
    rows = []
    for name, n in table.items():
        struct, member = name.split(".", 1)
        rows.append((struct, member, n))
    return rows


def test_every_c_struct_has_its_twin_or_none_by_decision(facts: AbiFacts) -> None:
    structs = {name.split(".")[0] for name in facts.offset} | set(facts.size)
    assert structs == set(TWINS) | NO_TWIN


def test_field_offsets_and_widths_are_nccls(facts: AbiFacts) -> None:
    checked = 0
    for struct, member, n in _rows(facts.offset):
        for cls in TWINS.get(struct, []):
            if struct == "dyn_prof_coll_v4_t" and member == "parentGroup":
                continue
            assert _path(cls, member)[0] == n, f"{cls.__name__}.{member}: {struct} has it at {n}"
            checked += 1
    for struct, member, n in _rows(facts.member_size):
        for cls in TWINS.get(struct, []):
            assert _path(cls, member)[1] == n, f"{cls.__name__}.{member}: {n} bytes in {struct}"
            checked += 1
    assert checked >= 60


def test_struct_sizes_are_nccls(facts: AbiFacts) -> None:
    for struct, n in facts.size.items():
        for cls in TWINS.get(struct, []):
            if struct in AT_LEAST:
                assert ct.sizeof(cls) >= n, struct
            else:
                assert ct.sizeof(cls) == n, struct


def test_event_bits_and_names_are_nccls(facts: AbiFacts) -> None:
    v = facts.value
    assert v["DYN_PROFILE_COLL"] == abi.PROFILE_COLL
    assert v["DYN_PROFILE_KERNEL_CH"] == abi.PROFILE_KERNEL_CH
    assert v["DYN_PROFILER_KERNEL_CH_STOP"] == abi.KERNEL_CH_STOP
    assert v["DYN_PROFILE_KERNEL_PHASE"] == abi.PROFILE_KERNEL_PHASE
    assert v["DYN_PROFILER_KERNEL_PHASE_STOP"] == abi.KERNEL_PHASE_STOP
    assert len(abi.FUNC_NAMES) == v["DYN_NUM_FUNCS"]
    assert {n: abi.ALGO_NAMES.index(n) for n in abi.ALGO_NAMES} == {
        k.removeprefix("DYN_ALGO_"): n for k, n in v.items() if k.startswith("DYN_ALGO_")
    }
    assert {n: abi.PROTO_NAMES.index(n) for n in abi.PROTO_NAMES} == {
        k.removeprefix("DYN_PROTO_"): n for k, n in v.items() if k.startswith("DYN_PROTO_")
    }

"""NCCL's integer ids in `dynamiccl.api.nccl` are the ones the plugin ABI carries.

The ids are read from `plugin/tests/test_abi_layout.c`, which asserts them against the plugin's
ABI header at compile time (tests/nccl_abi_facts.py runs it).
"""

from __future__ import annotations

from dynamiccl.api.nccl import NUM_ALGORITHMS, NUM_FUNCS, NUM_PROTOCOLS, Algo, Proto
from tests.nccl_abi_facts import nccl_abi_facts


def test_algorithm_and_protocol_ids_are_nccls() -> None:
    v = nccl_abi_facts().value
    assert {a: a.nccl_id for a in Algo} == {a: v[f"DYN_ALGO_{a.name}"] for a in Algo}
    assert {p: p.nccl_id for p in Proto} == {p: v[f"DYN_PROTO_{p.name}"] for p in Proto}
    assert (
        v["DYN_NUM_FUNCS"],
        v["DYN_NUM_ALGOS"],
        v["DYN_NUM_PROTOS"],
    ) == (NUM_FUNCS, NUM_ALGORITHMS, NUM_PROTOCOLS)

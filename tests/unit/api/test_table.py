"""The logical decision table: dimensions, validation, digest, and the reference decision."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    MAX_SCALES,
    N_SCALE_CLASSES,
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    ExploreSchedule,
    decide,
    eps_at,
    explore_hash,
    scale_class,
    size_bucket,
)


def test_size_bucket_is_floor_log2_clamped() -> None:
    assert [size_bucket(n) for n in (0, 1, 2, 3, 4, 1023, 1024)] == [0, 0, 1, 1, 2, 9, 10]
    assert size_bucket(1 << 40) == 40
    assert size_bucket((1 << 60) + 3) == 40


def test_scale_class_examples() -> None:
    assert scale_class(1, 1) == 0
    assert scale_class(8, 1) == 3
    assert scale_class(16, 2) == 8 + 3
    assert scale_class(2, 2) == 8
    assert scale_class(3, 8) == 3 * 8
    assert scale_class(0, 0) == 0
    assert scale_class(72, 1) == 7  # a GB200 NVL72 domain: 65+ ranks per node
    assert scale_class(9, 1) == 4  # 9..16 ranks per node: no longer the 8-rank class


def test_jobs_past_128_nodes_get_their_own_scale_class() -> None:
    """The old encoding put every communicator over 64 nodes in class 31; now 128, 1 024 and
    12 000 nodes are three classes, 2^14 nodes the last exact one, more share the top class."""
    got = [scale_class(8 * n, n) for n in (128, 1024, 12000, 1 << 14, (1 << 14) + 1, 10**6)]
    assert got == [7 * 8 + 3, 10 * 8 + 3, 14 * 8 + 3, 14 * 8 + 3, 15 * 8 + 3, 15 * 8 + 3]
    assert scale_class(10**9, 10**6) == N_SCALE_CLASSES - 1


@given(st.integers(min_value=1, max_value=1 << 40), st.integers(min_value=1, max_value=1 << 20))
def test_scale_class_is_in_range(nranks: int, nnodes: int) -> None:
    assert 0 <= scale_class(nranks, nnodes) < N_SCALE_CLASSES < 0xFF  # 0xFF: the plugin's "none"


def test_a_table_written_before_128_scale_classes_is_refused_not_misread() -> None:
    """A table of the 32-class encoding (no `scale_encoding`) names classes that now mean
    other shapes (31 was "over 64 nodes, 5+ ranks per node", now 3 nodes x 65+ ranks): it is
    refused with the reason, from JSON and from a parsed document; this version's own
    documents round-trip."""
    old = '{"version": 1, "scales": [31], "cells": [{"collective": "allreduce", "bucket": 20, '
    old += '"scale": 31, "choices": [{"algo": "tree", "proto": "simple"}]}]}'
    for parse in (DecisionTable.model_validate_json, lambda t: DecisionTable.model_validate(
        json.loads(t))):  # fmt: skip
        with pytest.raises(ValidationError, match="older DynamICCL, refused"):
            parse(old)
    with pytest.raises(ValidationError, match="encoding 1"):
        DecisionTable.model_validate({**json.loads(old), "scale_encoding": 1})
    new = DecisionTable(version=1, scales=(scale_class(96000, 12000),), cells=(_cell(115),))
    assert DecisionTable.model_validate_json(new.model_dump_json()) == new
    assert DecisionTable.model_validate(new.model_dump(mode="json")) == new


def test_choice_validation() -> None:
    assert Choice(algo=Algo.RING, proto=Proto.LL, chunk_bytes=1 << 20).chunk_log2 == 20
    assert Choice(algo=Algo.RING, proto=Proto.LL).chunk_log2 == 0
    with pytest.raises(ValidationError, match="power of two"):
        Choice(algo=Algo.RING, proto=Proto.LL, chunk_bytes=3000)
    with pytest.raises(ValidationError):
        Choice(algo=Algo.RING, proto=Proto.LL, nchannels=256)
    with pytest.raises(ValidationError):
        Choice.model_validate({"algo": "ring", "proto": "ll", "threads": 3})


def _cell(scale: int = 3, **kw: object) -> Cell:
    return Cell(
        collective=Collective.ALLREDUCE,
        bucket=10,
        scale=scale,
        choices=(
            Choice(algo=Algo.NVLS, proto=Proto.SIMPLE),
            Choice(algo=Algo.RING, proto=Proto.LL),
        ),
        **kw,
    )


def test_table_validation() -> None:
    with pytest.raises(ValidationError, match="not in scales"):
        DecisionTable(version=1, scales=(1,), cells=(_cell(3),))
    with pytest.raises(ValidationError, match="duplicate cell"):
        DecisionTable(version=1, scales=(3,), cells=(_cell(), _cell()))
    with pytest.raises(ValidationError, match="unique"):
        DecisionTable(version=1, scales=(3, 3))
    with pytest.raises(ValidationError):
        DecisionTable(version=1, scales=tuple(range(MAX_SCALES + 1)))
    assert DecisionTable(version=1, scales=tuple(range(MAX_SCALES))).scales[-1] == 7
    with pytest.raises(ValidationError):
        DecisionTable(version=1, scales=(N_SCALE_CLASSES,))


def test_digest_is_content_addressed() -> None:
    a = DecisionTable(version=1, scales=(3,), cells=(_cell(),))
    b = DecisionTable.model_validate_json(a.model_dump_json())
    c = DecisionTable(version=1, scales=(3,), cells=(_cell(explore=0.5),))
    assert a.digest == b.digest
    assert a.digest != c.digest


def test_decide_falls_back_through_ranked_choices() -> None:
    t = DecisionTable(version=1, scales=(3,), cells=(_cell(),))
    nbytes = 1 << 10
    all_ok = decide(t, Collective.ALLREDUCE, nbytes, 8, 1, 0, 0, lambda c: True)
    assert all_ok is not None
    assert all_ok.algo == Algo.NVLS
    no_nvls = decide(t, Collective.ALLREDUCE, nbytes, 8, 1, 0, 0, lambda c: c.algo != Algo.NVLS)
    assert no_nvls is not None
    assert no_nvls.algo == Algo.RING
    assert decide(t, Collective.ALLREDUCE, nbytes, 8, 1, 0, 0, lambda c: False) is None
    assert decide(t, Collective.ALLGATHER, nbytes, 8, 1, 0, 0, lambda c: True) is None
    assert decide(t, Collective.ALLREDUCE, nbytes, 16, 2, 0, 0, lambda c: True) is None


def test_exploration_rate_and_decay() -> None:
    cands = (Candidate(algo=Algo.TREE, proto=Proto.LL), Candidate(algo=Algo.PAT, proto=Proto.LL128))
    t = DecisionTable(
        version=1,
        scales=(3,),
        explore=ExploreSchedule(seed=5, half_life_log2=9),
        cells=(_cell(explore=0.5, candidates=cands),),
    )
    picks = [
        decide(t, Collective.ALLREDUCE, 1024, 8, 1, 11, j, lambda c: True) for j in range(4096)
    ]
    early = sum(p is not None and p.algo != Algo.NVLS for p in picks[:512]) / 512
    late = sum(p is not None and p.algo != Algo.NVLS for p in picks[3584:]) / 512
    assert 0.4 < early < 0.6
    assert late < 0.05
    assert eps_at(1000, 255, 10**9) == 1000
    assert eps_at(1000, 2, 4) == 500


@given(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1), st.integers(0, 1 << 40))
def test_explore_hash_is_a_64_bit_function_of_its_inputs(seed: int, comm: int, j: int) -> None:
    h = explore_hash(seed, comm, 8, 1, 4, 10, j)
    assert 0 <= h < 1 << 64
    assert h == explore_hash(seed, comm, 8, 1, 4, 10, j)


@settings(max_examples=300)
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_table_files_parse_or_fail_cleanly(text: str) -> None:
    with contextlib.suppress(ValidationError):
        DecisionTable.model_validate_json(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(json_values)
def test_structured_garbage_never_escapes_validation(doc: object) -> None:
    for model in (DecisionTable, Cell, Choice):
        with contextlib.suppress(ValidationError):
            model.model_validate(doc)

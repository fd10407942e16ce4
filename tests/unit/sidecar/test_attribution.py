"""Placing measured calls: table in effect, origin, arm."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.table import (
    Candidate,
    Cell,
    Choice,
    DecisionTable,
    decide,
    scale_class,
    size_bucket,
)
from dynamiccl.sidecar.attribution import (
    CellView,
    History,
    TableView,
    arm_of,
    attribute,
    classify,
)

SC = scale_class(8, 1)


def table(version: int, nch: int = 0) -> DecisionTable:
    return DecisionTable(
        version=version,
        scales=(SC,),
        cells=(
            Cell(
                collective=Collective.ALLREDUCE,
                bucket=20,
                scale=SC,
                choices=(Choice(algo=Algo.NVLS, proto=Proto.SIMPLE, nchannels=nch),),
                candidates=(
                    Candidate(algo=Algo.RING, proto=Proto.LL, nchannels=4, weight=3),
                    Candidate(algo=Algo.TREE, proto=Proto.SIMPLE, chunk_bytes=1 << 20),
                ),
                explore=0.5,
            ),
        ),
    )


def test_classify_table_choice_candidate_or_default() -> None:
    view = TableView(table(1)).cells[(4, 20, SC)]
    assert classify(view, 4, 2, 16) == ("table", (4, 2, 0, 0))  # nchannels 0: any count
    assert classify(view, 1, 0, 4) == ("explore", (1, 0, 4, 0))
    assert classify(view, 1, 0, 8) == ("default", (1, 0, 0, 0))  # wrong channel count
    assert classify(view, 0, 2, 12) == ("explore", (0, 2, 0, 1 << 20))
    assert classify(None, 1, 2, 12) == ("default", (1, 2, 0, 0))
    wildcard_first = CellView(choices=(), candidates=((1, 0, 0, 0), (1, 0, 8, 0)))
    assert classify(wildcard_first, 1, 0, 8) == ("explore", (1, 0, 8, 0))  # the exact count wins
    assert classify(wildcard_first, 1, 0, 5) == ("explore", (1, 0, 0, 0))
    pinned = TableView(table(1, nch=6)).cells[(4, 20, SC)]
    assert classify(pinned, 4, 2, 6)[0] == "table"
    assert classify(pinned, 4, 2, 16)[0] == "default"


def test_history_follows_committed_boundaries() -> None:
    h = History([(2048, TableView(table(2))), (1024, TableView(table(1)))])
    assert h.at(0) is None
    assert h.at(1023) is None
    assert h.at(1024).version == 1  # type: ignore[union-attr]
    assert h.at(2047).version == 1  # type: ignore[union-attr]
    assert h.at(2048).version == 2  # type: ignore[union-attr]
    assert h.latest is not None
    assert h.latest.version == 2
    assert len(h) == 2


def test_attribute_places_bucket_scale_version() -> None:
    h = History([(256, TableView(table(7)))])
    before = attribute(h, 4, 1 << 20, 8, 1, 100, 4, 2, 16)
    assert before == (0, 20, SC, "default", (4, 2, 0, 0))
    after = attribute(h, 4, (1 << 20) + 5, 8, 1, 300, 4, 2, 16)
    assert after == (7, 20, SC, "table", (4, 2, 0, 0))
    other_scale = attribute(h, 4, 1 << 20, 16, 2, 300, 4, 2, 16)
    assert other_scale.origin == "default"
    assert other_scale.scale == scale_class(16, 2)


@given(st.integers(0, 5000), st.sampled_from([(1 << 20), 3 << 19]))
def test_what_the_plugin_decides_is_classified_as_table_or_explore(j: int, nbytes: int) -> None:
    t = table(3)
    choice = decide(t, Collective.ALLREDUCE, nbytes, 8, 1, 5, j, lambda _c: True)
    assert choice is not None
    view = TableView(t).cells[(4, size_bucket(nbytes), SC)]
    nch = choice.nchannels or 24  # NCCL fills in its own count when the table leaves it
    origin, arm = classify(view, choice.algo.nccl_id, choice.proto.nccl_id, nch)
    assert arm == arm_of(choice)
    assert origin == ("table" if arm_of(choice) in view.choices else "explore")

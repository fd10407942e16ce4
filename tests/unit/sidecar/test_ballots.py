"""The pods' ballots: each pod's own key of its group's object, read back whole."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.api.epoch import Epoch
from dynamiccl.api.sidecar_objects import GROUP_SIZE, group_of, vote_groups
from dynamiccl.sidecar.ballots import Ballot, BallotBox, DirKeys, MemoryKeys, Vote, file_ballots
from dynamiccl.sidecar.cas import FileCAS, MemoryCAS


def box(pods: int) -> tuple[BallotBox, list[MemoryKeys]]:
    groups = [MemoryKeys() for _ in range(vote_groups(pods))]
    return BallotBox(groups), groups


def test_each_pod_writes_one_key_of_its_own_group_and_all_reads_every_ballot() -> None:
    b, groups = box(2000)
    assert len(groups) == 63  # ceil(2000 / 32)
    for i in range(2000):
        b.cast(f"pod-{i}", Ballot(reported=i))
    got = b.all()
    assert {v: x.reported for v, x in got.items()} == {f"pod-{i}": i for i in range(2000)}
    sizes = [len(g.data) for g in groups]
    assert sum(sizes) == 2000
    assert max(sizes) <= 2 * GROUP_SIZE  # a hash spreads them: no object holds many more
    for g, keys in enumerate(groups):
        assert all(group_of(v, 63) == g for v in keys.data)


def test_a_vote_counts_only_for_its_own_attempt() -> None:
    ep = Epoch(epoch=3, boundary=640, table_version=2, table_digest=9)
    v = Vote(epoch=3, boundary=640, digest=9, yes=True)
    assert v.on(ep)
    assert not v.on(ep.model_copy(update={"boundary": 704}))  # the retry of an aborted 3
    assert not v.on(ep.model_copy(update={"table_digest": 8}))


def test_a_ballot_in_another_pods_object_or_malformed_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b, groups = box(100)
    b.cast("pod-1", Ballot(reported=64))
    wrong = next(g for g in range(len(groups)) if g != group_of("pod-2", len(groups)))
    groups[wrong].put("pod-2", Ballot(reported=64).model_dump_json())  # not its own object
    groups[group_of("pod-3", len(groups))].put("pod-3", '{"reported": -5}')
    groups[group_of("pod-4", len(groups))].put("pod-4", "not json")
    with caplog.at_level(logging.WARNING):
        assert set(b.all()) == {"pod-1"}
    assert "not its own" in caplog.text
    assert caplog.text.count("malformed") == 2


@given(st.text(max_size=200))
def test_any_stored_text_is_a_ballot_or_ignored(raw: str) -> None:
    b, groups = box(1)
    groups[0].put("pod-0", raw)
    got = b.all()
    assert set(got) <= {"pod-0"}
    assert all(isinstance(x, Ballot) for x in got.values())


def test_a_restarted_sidecar_finds_its_ballot_and_file_ballots_sit_beside_the_record(
    tmp_path: Path,
) -> None:
    b = file_ballots(FileCAS(tmp_path / "record.json"))
    vote = Vote(epoch=1, boundary=64, digest=1, yes=False, reason="a process is past K")
    b.cast("pod-0", Ballot(reported=64, needs=1, vote=vote))
    again = file_ballots(FileCAS(tmp_path / "record.json"))
    mine = again.mine("pod-0")
    assert mine is not None
    assert mine.vote == vote
    assert again.mine("pod-1") is None
    with pytest.raises(TypeError):
        file_ballots(MemoryCAS())


def test_dir_keys_refuse_names_that_leave_the_directory(tmp_path: Path) -> None:
    keys = DirKeys(tmp_path / "b")
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="not a ballot key"):
            keys.put(bad, "{}")
    assert keys.items() == {}

"""The proposer folds the pods' ballots into the record: a job of 2 000 pods commits an epoch
with two writes of the record, and every invariant of the single-record protocol holds."""

from __future__ import annotations

from dynamiccl.api.epoch import Epoch, EpochRecord, EpochStatus, propose
from dynamiccl.api.sidecar_objects import vote_groups
from dynamiccl.api.table import DecisionTable
from dynamiccl.sidecar.ballots import Ballot, BallotBox, MemoryKeys, Vote
from dynamiccl.sidecar.cas import MemoryCAS, load_record
from dynamiccl.sidecar.proposer import Coordinator, TableStore, init_record
from dynamiccl.sidecar.tally import fold

L = 64
PODS = 2000


class Tables:
    def __init__(self) -> None:
        self.by_version: dict[int, DecisionTable] = {}

    def put(self, table: DecisionTable) -> None:
        self.by_version[table.version] = table

    def get(self, version: int) -> DecisionTable | None:
        return self.by_version.get(version)


TABLE = DecisionTable(version=1, scales=(), cells=())


class Job:
    """`pods` pods' ballots (in-memory objects) and the record on an in-memory CAS; the
    proposer is the product's `Coordinator`."""

    def __init__(self, pods: int) -> None:
        self.names = [f"llm-worker-{i}" for i in range(pods)]
        self.groups = [MemoryKeys() for _ in range(vote_groups(pods))]
        self.box = BallotBox(self.groups)
        self.cas = MemoryCAS()
        tables: TableStore = Tables()
        self.coord = Coordinator(self.cas, tables, lead=4, ballots=self.box)
        init_record(self.cas, L, (self.names[0],))
        self.writes_before = self.cas.writes
        for i, name in enumerate(self.names):
            self.box.cast(name, Ballot(reported=L + (i % 3) * L, needs=1))

    def record(self) -> EpochRecord:
        rec, _ = load_record(self.cas)
        assert rec is not None
        return rec

    def vote(self, ep: Epoch, names: list[str], yes: bool = True) -> None:
        for name in names:
            v = Vote(epoch=ep.epoch, boundary=ep.boundary, digest=ep.table_digest, yes=yes)
            self.box.cast(name, Ballot(reported=3 * L, needs=1, vote=v))


def test_two_thousand_pods_commit_an_epoch_with_two_record_writes_besides_the_joins() -> None:
    job = Job(PODS)
    job.coord.step()  # the pods joined through their ballots: one write
    assert len(job.record().voters) == PODS
    joined = job.cas.writes
    assert joined - job.writes_before == 1
    epoch = job.coord.publish(TABLE)
    assert epoch == 1
    ep = job.record().pending
    assert ep is not None
    assert ep.boundary == 3 * L + 4 * L  # past every pod's report (folded into the proposal)
    job.vote(ep, job.names[:-1])
    job.coord.step()
    assert job.record().pending is not None  # one pod has not voted: nothing decided
    job.vote(ep, job.names[-1:])
    job.coord.step()
    (done,) = job.record().epochs
    assert done.status == EpochStatus.COMMITTED
    assert done.votes == {}  # the record carries no yes votes (2 000 names per epoch)
    assert job.cas.writes - joined == 2  # the proposal and the outcome
    assert job.cas.conflicts == 0
    assert max(len(g.data) for g in job.groups) <= 64
    # what every pod reads each step: the voters and the epochs, not 2 000 pods' reports
    assert job.record().reported == {}
    assert job.record().needs == {}
    assert len(job.cas.value or "") < 20 * PODS


def test_one_no_aborts_and_the_record_says_who_and_why() -> None:
    job = Job(64)
    job.coord.step()
    job.coord.publish(TABLE)
    ep = job.record().pending
    assert ep is not None
    job.vote(ep, job.names[1:])
    v = Vote(epoch=1, boundary=ep.boundary, digest=ep.table_digest, yes=False, reason="past K")
    job.box.cast(job.names[0], Ballot(reported=9 * L, vote=v))
    job.coord.step()
    (done,) = job.record().epochs
    assert done.status == EpochStatus.ABORTED
    assert done.votes == {job.names[0]: False}
    assert done.reason == f"voted no: {job.names[0]}: past K"


def test_a_vote_for_an_aborted_attempt_does_not_count_for_the_retry() -> None:
    job = Job(8)
    job.coord.step()
    job.coord.publish(TABLE)
    first = job.record().pending
    assert first is not None
    job.vote(first, job.names[:1], yes=False)
    job.coord.step()
    job.vote(first, job.names[1:])  # late yes votes on the aborted attempt
    job.coord.publish(TABLE)
    retry = job.record().pending
    assert retry is not None
    assert (retry.epoch, retry.attempt) == (1, 2)
    assert retry.boundary > first.boundary
    job.coord.step()
    assert job.record().pending is not None  # nobody voted on the retry yet
    job.vote(retry, job.names)
    job.coord.step()
    assert job.record().epochs[-1].status == EpochStatus.COMMITTED


def test_a_pod_that_joins_while_an_epoch_is_pending_aborts_it() -> None:
    """As in the single-record protocol: an epoch's votes are counted over the voters it
    was proposed to; a pod that was not among them may run processes past its boundary."""
    job = Job(16)
    job.coord.step()
    job.coord.publish(TABLE)
    ep = job.record().pending
    assert ep is not None
    job.vote(ep, job.names)
    job.box.cast("llm-worker-16", Ballot(reported=L, needs=1))  # a replaced pod
    job.coord.step()
    rec = job.record()
    assert rec.epochs[-1].status == EpochStatus.ABORTED
    assert rec.epochs[-1].reason == "llm-worker-16 joins"
    assert "llm-worker-16" in rec.voters


def test_fold_is_the_single_record_protocol_for_an_undecided_epoch() -> None:
    rec = EpochRecord(interval=L, voters=("a", "b"))
    rec = propose(rec, 1, 7, lead=2)
    ep = rec.pending
    assert ep is not None
    yes = Vote(epoch=1, boundary=ep.boundary, digest=7, yes=True)
    folded = fold(rec, {"a": Ballot(reported=L, needs=1, vote=yes)})
    assert folded.pending == ep  # undecided: unchanged, no votes stored
    assert folded.reported == {"a": L}
    assert folded.needs == {"a": 1}

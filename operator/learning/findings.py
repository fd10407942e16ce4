"""Which measured configurations every new job of a hardware class starts with (issue 29).

A configuration becomes a class's *finding* in a cell on the evidence of
several independent jobs, each measuring it against NCCL's own choice inside
the job (a paired comparison: same nodes, same time), never on the pooled
numbers, which one job posting made-up rewards can move anywhere:

- NCCL's own pair in the cell is the (algorithm, protocol) most jobs ran as
  NCCL's own decision (one job cannot outvote the others with its call counts);
- a job's verdict on configuration C: its calls of C against its calls of NCCL's
  pair (any origin, `MIN_CALLS` each; a job without both gives none). It
  *supports* C when C was at least `1 + DEPARTURE_MARGIN` times faster and
  `FINDING_Z` standard errors clear of no gain (the job's noise from its
  p99/p50 ratio, lognormal), *contradicts* it when C was clearly below that
  margin, or when its guardrail reverted the cell while the table ran C, or when
  its step times refused C there (C made its collectives faster and its training
  step slower: operator/learning/step_verdicts.py);
- C *holds* when `confirm_jobs` jobs support it, from `confirm_namespaces`
  namespaces (all of the class's namespaces where it has fewer), and none of the
  latest `confirm_jobs` verdicts contradicts it: a finding that stops holding
  (the surface changed back, a guardrail reverts it) is withdrawn at the next
  job that measures so.

One lying job can therefore neither create a finding (it is one job) nor keep
one (the next honest verdicts outweigh it); it can withdraw one, which sends the
class back to its model's choice until honest jobs confirm it again.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Final

from dynamiccl.api.learning import (
    DEPARTURE_MARGIN,
    FINDING_Z,
    MAX_FINDINGS,
    MIN_CALLS,
    ConfigKey,
    Finding,
)
from dynamiccl.api.recency import still_holds
from dynamiccl.operator.store.evidence import JobMeasure

CellId = tuple[str, int, int, str, int]  # (class, nranks, nnodes, collective, bucket)
Refused = tuple[str, int, int, int, ConfigKey]  # (collective, bucket, nranks, nnodes, config)
Z99: Final = 2.326  # the standard normal's 99th percentile: ln(p99/p50) = Z99 * sigma
MIN_SIGMA: Final = 0.005  # a job claiming no noise at all still has this much


@dataclass(frozen=True)
class Rules:
    """How much independent evidence a finding needs (the policy's `exploration`)."""

    confirm_jobs: int = 2
    confirm_namespaces: int = 2


@dataclass
class _Arm:
    calls: int = 0
    time_us: float = 0.0
    ratio: float = 0.0  # summed p99/p50 over calls
    table_calls: int = 0
    first_id: int = 0

    def add(self, m: JobMeasure) -> None:
        self.first_id = min(self.first_id, m.first_id) if self.calls else m.first_id
        self.calls += m.calls
        self.time_us += m.time_us
        self.ratio += m.p99_over_p50
        self.table_calls += m.table_calls

    def log_mean_se2(self) -> tuple[float, float]:
        """log of the mean time and its squared standard error."""
        sigma = max(math.log(max(self.ratio / self.calls, 1.0)) / Z99, MIN_SIGMA)
        return math.log(self.time_us / self.calls), sigma * sigma / self.calls


@dataclass
class _Job:
    namespace: str
    arms: dict[ConfigKey, _Arm] = field(default_factory=lambda: defaultdict(_Arm))
    own: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


@dataclass(frozen=True)
class Verdict:
    """One job's word on one configuration of a cell."""

    job_uid: str
    namespace: str
    order: int
    log_speedup: float | None  # None: contradicted by a guardrail revert or step refusal
    supports: bool
    step_slower: bool = False  # contradicted because the job's step got slower with it


def _by_cell(measures: Iterable[JobMeasure]) -> dict[CellId, dict[str, _Job]]:
    cells: dict[CellId, dict[str, _Job]] = defaultdict(dict)
    for m in measures:
        job = cells[m.cell].setdefault(m.job_uid, _Job(m.namespace))
        job.arms[m.config].add(m)
        if m.own_calls:
            job.own[(m.algo, m.proto)] += m.own_calls
    return cells


def nccl_pair(jobs: Mapping[str, _Job]) -> tuple[str, str] | None:
    """The (algorithm, protocol) most jobs ran as NCCL's own decision in the cell."""
    votes: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for job in jobs.values():
        if job.own:
            pair, calls = max(job.own.items(), key=lambda kv: (kv[1], kv[0]))
            votes[pair][0] += 1
            votes[pair][1] += calls
    if not votes:
        return None
    return max(votes.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))[0]


def verdict(  # noqa: PLR0917 - the job's word needs each of these
    uid: str,
    job: _Job,
    config: ConfigKey,
    ref: ConfigKey,
    reverted: bool,
    step_slower: bool = False,
) -> Verdict | None:
    """The job's word on `config` against NCCL's own `ref` in the cell (None: no word);
    `step_slower`: the job's step times refused `config` in the cell."""
    arm, base = job.arms.get(config), job.arms.get(ref)
    if arm is None or arm.calls < MIN_CALLS:
        return None
    if (reverted and arm.table_calls) or step_slower:
        return Verdict(uid, job.namespace, arm.first_id, None, False, step_slower)
    if base is None or base.calls < MIN_CALLS:
        return None
    (lc, sc), (lr, sr) = arm.log_mean_se2(), base.log_mean_se2()
    gain, se, bar = lr - lc, math.sqrt(sc + sr), math.log1p(DEPARTURE_MARGIN)
    if gain >= bar and gain - FINDING_Z * se > 0:
        return Verdict(uid, job.namespace, arm.first_id, gain, supports=True)
    if gain + FINDING_Z * se < bar:
        return Verdict(uid, job.namespace, arm.first_id, gain, supports=False)
    return None


def judge(verdicts: list[Verdict], rules: Rules, class_namespaces: int) -> bool:
    """Does a configuration with these verdicts hold (see the module docstring)?"""
    ordered = sorted(verdicts, key=lambda v: v.order)
    support = [v for v in ordered if v.supports]
    need_ns = max(1, min(rules.confirm_namespaces, class_namespaces))
    return (
        len(support) >= rules.confirm_jobs
        and len({v.namespace for v in support}) >= need_ns
        and still_holds([v.supports for v in ordered], rules.confirm_jobs)
    )


def _finding(cid: CellId, config: ConfigKey, pair: tuple[str, str], vs: list[Verdict],
             holds: bool) -> Finding:  # fmt: skip
    support = [v.log_speedup for v in vs if v.supports and v.log_speedup is not None]
    return Finding(
        collective=cid[3], size_bucket=cid[4], nranks=cid[1], nnodes=cid[2],
        algo=config[0], proto=config[1], nchannels=config[2], chunk_bytes=config[3],
        speedup=math.exp(sum(support) / len(support)) if support else 0.0,
        nccl_algo=pair[0], nccl_proto=pair[1],
        supporting=len(support), namespaces=len({v.namespace for v in vs if v.supports}),
        contradicting=sum(not v.supports for v in vs), holds=holds,
        step_slower=sum(v.step_slower for v in vs),
    )  # fmt: skip


def findings(
    measures: Iterable[JobMeasure],
    reverts: set[tuple[str, str, int]],
    class_namespaces: Mapping[str, int],
    rules: Rules = Rules(),
    refused: Set[tuple[str, Refused]] = frozenset(),
) -> dict[str, list[Finding]]:
    """Per hardware class: every configuration some job supports, holding ones first.

    `refused`: (job uid, (collective, bucket, nranks, nnodes, configuration)) of the
    changes the jobs' step times refused (operator/store/steps.py)."""
    out: dict[str, list[Finding]] = defaultdict(list)
    for cid, jobs in _by_cell(measures).items():
        pair = nccl_pair(jobs)
        if pair is None:
            continue
        ref: ConfigKey = (pair[0], pair[1], 0, 0)
        configs = {k for job in jobs.values() for k in job.arms if k != ref}
        for config in configs:
            here = (cid[3], cid[4], cid[1], cid[2], config)
            vs = [
                v
                for uid, job in jobs.items()
                if (
                    v := verdict(
                        uid, job, config, ref,
                        (uid, cid[3], cid[4]) in reverts, (uid, here) in refused,
                    )
                )
            ]  # fmt: skip
            if any(v.supports for v in vs):
                holds = judge(vs, rules, class_namespaces.get(cid[0], 1))
                out[cid[0]].append(_finding(cid, config, pair, vs, holds))
    for hw, found in out.items():
        found.sort(key=lambda f: (not f.holds, -f.supporting, -f.speedup))
        out[hw] = found[:MAX_FINDINGS]
    return dict(out)

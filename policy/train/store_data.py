"""An offline update's training set, streamed from the store with each job's features.

Every stored reward record is read once, in id order, page by page
(`dynamiccl.api.experience.read_training_rows`: the experience joined with the
job's stored features, schema version 5). A record is usable when it is a valid
`RewardRecord` and its job has features this code can read: stored with the
experience (or given in a features file, which wins), of schema version
`FEATURES_VERSION`, valid `StateFeatures`, and the recorded configuration is
feasible for that communicator. Every other row is skipped and counted by
reason, never fatal (a `step_slower` row: the learning loop found that this
configuration made the job's collectives faster and its training step slower in
that cell, operator/learning/step_verdicts.py; that job's kernel times of it are
not learned from):

| metric | the row |
|---|---|
| `offline/skipped_invalid_row` | does not validate as a reward record |
| `offline/skipped_no_features` | its job has no stored features (and none in the file) |
| `offline/skipped_unknown_schema_version` | its job's features are of an unknown schema |
| `offline/skipped_invalid_features` | its job's features fail validation |
| `offline/skipped_infeasible` | the configuration or communicator is impossible under our masks |
| `offline/skipped_step_slower` | its job's step times refused it (see above) |

Usable records are folded as they stream by: the calls and the call-weighted
log-advantage of each (observation point, configuration) are summed, where a
point is (job features, communicator, collective, size bucket), and
each configuration is weighted by its mean advantage (`Weighting`). Memory is
bounded by the distinct points, not the rows (10^6 rows of one cluster are a
few thousand points).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from pydantic import ValidationError

from dynamiccl.api.experience import TRAINING_STEP_REFUSED, read_training_rows, record_of
from dynamiccl.api.features import FEATURES_VERSION, StateFeatures
from dynamiccl.api.learning import DEPARTURE_MARGIN, MIN_CALLS
from dynamiccl.api.recency import still_holds
from dynamiccl.api.rewards import RewardRecord
from dynamiccl.policy.runtime.decide import Decider
from dynamiccl.policy.runtime.ranker import Ranker
from dynamiccl.policy.runtime.space import ActionLimits, channel_index, chunk_index
from dynamiccl.policy.sim.system import derive_spec

SKIP_REASONS: Final = (
    "invalid_row",
    "no_features",
    "unknown_schema_version",
    "invalid_features",
    "infeasible",
    "step_slower",
)
Action = tuple[int, int, int, int]
# (features key, nranks, nnodes, collective id, size in 1/8 octaves)
PointKey = tuple[str, int, int, int, int]


CONFIDENT_CALLS: Final = 16  # calls of a configuration at a point before its mean is trusted
TRACKED_JOBS: Final = 16  # the latest jobs whose own advantage is kept per (point, config)
CLAIMED_GAIN: Final = math.log1p(DEPARTURE_MARGIN)  # a log-advantage over this is a claimed gain


@dataclass(frozen=True)
class Weighting:
    """Weight of a configuration at a point, from all its measured calls.

    min(exp(beta * A), max_weight) * min(1, calls / CONFIDENT_CALLS), with A the
    call-weighted mean of log(T_nccl / T) over its records: what the measurements
    say of the configuration, not how often it ran. Summing per record instead
    would let NCCL's own choice, which runs almost every call, outweigh a
    configuration a few jobs explored and measured faster (the target of the
    regression, exp(beta * A) across configurations, is what matters).
    """

    beta: float = 10.0
    max_weight: float = 20.0
    # A configuration measured faster than NCCL's own counts only once this many jobs each
    # measured it faster (issue 29): one job's sidecar can report anything, and at weight 20
    # its made-up gain alone steered the retrained model. Until then a claimed gain (over
    # CLAIMED_GAIN) weighs nothing and a smaller one none (weight 1, as NCCL's own: dropping
    # NCCL's own pick for its noise taught a retrain to leave it); then its gain is at most
    # what the `min_jobs`-th most favourable job measured, so one job's many made-up calls
    # cannot outweigh another job's measurement. Slower counts at once, and a gain the
    # latest `min_jobs` measuring jobs do not all confirm is not learned (the findings'
    # recency, dynamiccl/api/recency.py): its gain is at most the worst of theirs.
    min_jobs: int = 2

    def of(
        self,
        calls: int,
        sum_adv: float,
        per_job: Sequence[float] | None = None,
        measured: Sequence[float] | None = None,
    ) -> float:
        """The weight; `per_job`: each job's own mean advantage (None: not counted, the
        in-memory records of the features-file path); `measured`: those of the jobs that
        measured it (`MIN_CALLS` calls), oldest first."""
        adv = sum_adv / calls
        held = not measured or still_holds([a >= CLAIMED_GAIN for a in measured], self.min_jobs)
        if adv > 0 and not held and measured:
            adv = min(adv, *measured[-self.min_jobs :])
        if per_job is not None and adv > 0:
            ranked = sorted(per_job, reverse=True)
            if len(ranked) >= self.min_jobs:
                adv = min(adv, ranked[self.min_jobs - 1])
            elif adv > CLAIMED_GAIN:
                return 0.0
            else:  # within the noise of NCCL's own (NCCL's own itself, mostly): no gain
                adv = 0.0
        conf = min(1.0, calls / CONFIDENT_CALLS)
        return min(math.exp(min(self.beta * adv, 50.0)), self.max_weight) * conf

    def departure_weight(self) -> float:
        """The weight of a configuration confirmed a departure (`CLAIMED_GAIN` faster than
        NCCL's own, measured `CONFIDENT_CALLS` calls), at the least."""
        return min(math.exp(self.beta * CLAIMED_GAIN), self.max_weight)


@dataclass
class TrainingData:
    """Calls and summed log-advantage per (point, configuration), and what was skipped."""

    weighting: Weighting = field(default_factory=Weighting)
    features: dict[str, StateFeatures] = field(default_factory=dict)  # by features key
    calls: Counter[tuple[PointKey, Action]] = field(default_factory=Counter)
    adv: dict[tuple[PointKey, Action], float] = field(default_factory=dict)  # calls x log(T0/T)
    counts: Counter[tuple[PointKey, Action]] = field(default_factory=Counter)  # records each
    # per (point, configuration) the latest TRACKED_JOBS jobs' [calls, calls x log-advantage],
    # oldest first (rows stream in store id order)
    jobs: dict[tuple[PointKey, Action], dict[str, list[float]]] = field(default_factory=dict)

    def per_job(self, key: tuple[PointKey, Action], min_calls: int = 1) -> list[float] | None:
        """Each tracked job's mean log-advantage of a (point, configuration), oldest first,
        of the jobs with `min_calls` calls of it; None when the records were not counted by
        job."""
        got = self.jobs.get(key)
        return None if got is None else [a / n for n, a in got.values() if n >= min_calls]

    def weight(self, key: tuple[PointKey, Action]) -> float:
        """The training weight of a (point, configuration) (`Weighting.of`)."""
        return self.weighting.of(
            self.calls[key], self.adv[key], self.per_job(key), self.per_job(key, MIN_CALLS)
        )

    skipped: Counter[str] = field(default_factory=Counter)
    pending_points: int = 0  # points left out of the update: a gain there awaits confirmation
    records: int = 0
    used: int = 0
    cursor: int = 0  # the highest store id read

    def add(self, features_key: str, rec: RewardRecord, job_uid: str | None = None) -> None:
        """Fold one usable record (its job's features already in `features`).

        The point's size is the middle of the record's size bucket, where the table
        compiler asks the policy (policy/runtime/compile.py): the table decides per
        bucket, so what a job measured in a bucket is what the bucket's decision learns.
        """
        point = (
            features_key,
            rec.nranks,
            rec.nnodes,
            rec.collective.nccl_id,
            8 * rec.size_bucket + 4,
        )
        act = (
            rec.algo.nccl_id,
            rec.proto.nccl_id,
            channel_index(rec.nchannels),
            chunk_index(rec.chunk_bytes),
        )
        key = (point, act)
        self.calls[key] += rec.count
        adv = math.log(rec.nccl_default_time_us / rec.mean_time_us)
        self.adv[key] = self.adv.get(key, 0.0) + rec.count * adv
        self.counts[key] += 1
        if job_uid is not None:  # rows of the store: by job (in-memory records: not)
            seen = self.jobs.setdefault(key, {})
            if job_uid not in seen and len(seen) >= TRACKED_JOBS:
                del seen[next(iter(seen))]  # the oldest job makes way for the latest
            acc = seen.setdefault(job_uid, [0.0, 0.0])
            acc[0] += rec.count
            acc[1] += rec.count * adv
        self.used += 1

    def stats(self) -> dict[str, float]:
        """`offline/records`, `offline/used` and one `offline/skipped_<reason>` per reason."""
        out = {"offline/records": float(self.records), "offline/used": float(self.used)}
        out |= {f"offline/skipped_{r}": float(self.skipped[r]) for r in SKIP_REASONS}
        out["offline/pending_points"] = float(self.pending_points)
        return out


class _FeatureResolver:
    """Job uid -> (features key, None) or (None, skip reason); parsed once per job."""

    def __init__(self, data: TrainingData, overrides: Mapping[str, StateFeatures]) -> None:
        self.data = data
        self.overrides = overrides
        self.cache: dict[str, tuple[str | None, str | None]] = {}

    def _keep(self, f: StateFeatures) -> str:
        key = hashlib.sha256(f.model_dump_json().encode()).hexdigest()[:16]
        self.data.features.setdefault(key, f)
        return key

    def resolve(self, uid: str, version: Any, text: Any) -> tuple[str | None, str | None]:
        got = self.cache.get(uid)
        if got is None:
            got = self.cache[uid] = self._resolve(uid, version, text)
        return got

    def _resolve(self, uid: str, version: Any, text: Any) -> tuple[str | None, str | None]:
        if uid in self.overrides:
            return self._keep(self.overrides[uid]), None
        if text is None:
            return None, "no_features"
        try:
            doc = json.loads(str(text))
        except ValueError:
            return None, "invalid_features"
        stated = doc.get("version", 1) if isinstance(doc, dict) else None
        if version != FEATURES_VERSION or stated != FEATURES_VERSION:
            return None, "unknown_schema_version"
        try:
            return self._keep(StateFeatures.model_validate(doc)), None
        except ValidationError:
            return None, "invalid_features"


def fold_rows(
    data: TrainingData, rows: Iterable[tuple[Any, ...]], resolver: _FeatureResolver
) -> None:
    """Fold `SELECT_TRAINING` rows into `data` (counting every skipped one)."""
    for row in rows:
        data.records += 1
        data.cursor = max(data.cursor, int(row[0]))
        try:
            rec = record_of(row)
        except (ValidationError, ValueError, TypeError):
            data.skipped["invalid_row"] += 1
            continue
        if row[TRAINING_STEP_REFUSED]:
            data.skipped["step_slower"] += 1
            continue
        key, why = resolver.resolve(str(row[1]), row[-2], row[-1])
        if key is None:
            data.skipped[why or "no_features"] += 1
            continue
        data.add(key, rec, str(row[1]))


def collect(
    url: str,
    *,
    after_id: int = 0,
    overrides: Mapping[str, StateFeatures] | None = None,
    weighting: Weighting | None = None,
    page: int = 10_000,
) -> TrainingData:
    """Stream the store's rows after `after_id` into a TrainingData."""
    data = TrainingData(weighting=weighting or Weighting())
    resolver = _FeatureResolver(data, overrides or {})
    for rows in read_training_rows(url, after_id=after_id, page=page):
        fold_rows(data, rows, resolver)
    return data


@dataclass(frozen=True)
class Encoded:
    """Observation, feasibility, action and summed weight per (point, configuration)."""

    obs: NDArray[np.float32]
    feasible: NDArray[np.bool_]
    actions: NDArray[np.int64]
    weight: NDArray[np.float32]


def _communicator(features: StateFeatures, nranks: int, nnodes: int) -> Any:
    """The record's communicator: the job's topology, or the sub-communicator it names."""
    spec = features.topology.spec()
    if nranks == features.world_size and nnodes == spec.nodes:
        return features
    per_node = max(1, nranks // max(nnodes, 1))
    return derive_spec(spec, nodes=nnodes, gpus_per_node=min(per_node, spec.gpus_per_node))


def encode(
    data: TrainingData, ranker: Ranker, limits: ActionLimits | None = None
) -> Encoded | None:
    """Encode every (point, configuration); infeasible ones move to `skipped['infeasible']`.

    Points of one communicator are encoded in one call (one Decider per
    (features, nranks, nnodes)). None when nothing is usable.
    """
    groups: dict[tuple[str, int, int], list[tuple[PointKey, Action, float]]] = {}
    for point, act in data.calls:
        w = data.weight((point, act))
        groups.setdefault(point[:3], []).append((point, act, w))

    def drop(point: PointKey, act: Action) -> None:
        n = data.counts[(point, act)]
        data.used -= n
        data.skipped["infeasible"] += n

    obs, feas, acts, wts = [], [], [], []
    for (fkey, nranks, nnodes), items in groups.items():
        try:
            dec = Decider.of(ranker, _communicator(data.features[fkey], nranks, nnodes), limits)
            colls = np.array([p[3] for p, _, _ in items], dtype=np.int64)
            sizes = np.array([2.0 ** (p[4] / 8) for p, _, _ in items])
            o, f, _ = dec.inputs(colls, sizes)
        except ValueError:
            for p, act, _ in items:
                drop(p, act)
            continue
        # A point where one job's gain waits for confirmation (weight 0) is left out whole,
        # while no other configuration's gain there is confirmed (weight above NCCL's own,
        # 1): learning NCCL's own there, alone, would teach the model to abandon the very
        # configuration the job measured faster (and the parent's choice with it). Once one
        # is confirmed, the point is learned and the unconfirmed claim weighs nothing: two
        # jobs that each committed the faster pair at another channel count (the early
        # escape) and a third that repeated one of them teach the retrain that pair
        gained = {p for p, _, w in items if w > 1.0}
        pending = {p for p, _, w in items if w <= 0.0} - gained
        data.pending_points += len(pending)
        # At a point with a confirmed departure the regression imitates the departures alone:
        # next to NCCL's own and the looks that measured about as fast, the target spread the
        # point over them (7.9 : 1 : 1 : 0.85 for a 1.23x gain) and the new pair's probability
        # stayed under the compile's confidence, so the confirmed gain never reached a table.
        floor = data.weighting.departure_weight()
        departed = {p for p, _, w in items if w >= floor} & gained
        for i, (p, act, w) in enumerate(items):
            if not f[i][act]:
                drop(p, act)
                continue
            if p in pending or w <= 0.0:  # a claim awaiting confirmation teaches nothing
                continue
            if p in departed and w < floor:  # beaten there by a confirmed departure
                continue
            obs.append(o[i])
            feas.append(f[i])
            acts.append(act)
            wts.append(w)
    if not obs:
        return None
    return Encoded(
        obs=np.stack(obs).astype(np.float32),
        feasible=np.stack(feas),
        actions=np.array(acts, dtype=np.int64),
        weight=np.array(wts, dtype=np.float32),
    )

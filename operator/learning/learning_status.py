"""The learning loop's status step: what measurements settled, and what the last retrain used.

Every tick with new experience (operator/learning/loop.py) the primary learned
policy's `status.learning` (dynamiccl/api/learning.py) is recomputed from the
store and merge-patched when it changed:

- per hardware class and cell, each measured configuration: calls, jobs,
  speedup over NCCL's own choice in that cell (NCCL's own measured time when
  the cell has `MIN_CALLS` of it, else the sidecars' NCCL-default estimate);
  settled cells; departures (measured >= 1 + DEPARTURE_MARGIN faster than
  NCCL's own) and whether jobs adopted them (ran them as their table's choice);
- per hardware class the findings (operator/learning/findings.py): what several
  independent jobs measured faster than NCCL's own, each inside the job; only a
  holding finding settles its cell (a departure alone is one job's word);
- the newest registered model's rows read, used and skipped by reason (its
  training metrics `offline/*`).

The operator reads the job's hardware class from it when it compiles the job's
table (policy/runtime/exploration.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dynamiccl.api.learning import (
    DEPARTURE_MARGIN,
    MAX_CELLS,
    MAX_CLASSES,
    MAX_DEPARTURES,
    MAX_MEASURED,
    MIN_CALLS,
    SETTLE_CONFIGS,
    CellCoverage,
    ClassCoverage,
    ConfigKey,
    Departure,
    Finding,
    LearningStatus,
    MeasuredConfig,
    RetrainRows,
    RolloutStatus,
)
from dynamiccl.api.registry import ModelStatus, ModelVersion
from dynamiccl.api.tuning_policy import Exploration
from dynamiccl.operator.cluster_api import ClusterAPI
from dynamiccl.operator.kube import Resource
from dynamiccl.operator.learning import findings as findings_mod
from dynamiccl.operator.store import evidence
from dynamiccl.operator.store import steps as step_store
from dynamiccl.operator.store.coverage import Measured, class_jobs, measured
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.operator.store.registry import ModelRegistry

CellId = tuple[str, int, int, str, int]  # (class, nranks, nnodes, collective, bucket)


@dataclass
class _Acc:
    calls: int = 0
    time_us: float = 0.0
    jobs: int = 0
    own: int = 0  # calls as NCCL's own decision
    table: int = 0  # calls as the table's choice


@dataclass
class _Cell:
    configs: dict[ConfigKey, _Acc] = field(default_factory=lambda: defaultdict(_Acc))
    calls: int = 0
    default_us: float = 0.0  # summed NCCL-default estimate


def _fold(rows: Iterable[Measured]) -> dict[CellId, _Cell]:
    cells: dict[CellId, _Cell] = defaultdict(_Cell)
    for m in rows:
        cell = cells[(m.hardware_class, m.nranks, m.nnodes, m.collective, m.size_bucket)]
        acc = cell.configs[(m.algo, m.proto, m.nchannels, m.chunk_bytes)]
        acc.calls += m.calls
        acc.time_us += m.time_us
        acc.jobs = m.jobs
        acc.own += m.own_calls
        acc.table += m.table_calls
        cell.calls += m.calls
        cell.default_us += m.nccl_default_us
    return cells


def _reference_us(cell: _Cell) -> float:
    """NCCL's own time in the cell: measured when there is enough of it, else estimated."""
    own = [a for a in cell.configs.values() if a.own >= MIN_CALLS]
    if own:
        best = max(own, key=lambda a: a.own)
        return best.time_us / best.calls
    return cell.default_us / max(cell.calls, 1)


def _coverage(
    cid: CellId, cell: _Cell, found: bool = False, judged: Set[ConfigKey] = frozenset()
) -> CellCoverage:
    ref = _reference_us(cell)
    measured = [
        MeasuredConfig(
            algo=k[0],
            proto=k[1],
            nchannels=k[2],
            chunk_bytes=k[3],
            calls=a.calls,
            jobs=a.jobs,
            speedup=ref / (a.time_us / a.calls) if a.time_us > 0 else 0.0,
            nccl_own=a.own >= MIN_CALLS,
            as_table=a.table,
        )
        for k, a in cell.configs.items()
        if a.calls > 0
    ]
    measured.sort(key=lambda m: (not m.nccl_own, -m.calls))
    # decided: measured enough, or ruled out (clearly slower after a few calls): what the
    # exploration assignment (policy/runtime/exploration.py) stops exploring, so a cell
    # whose alternatives were all ruled out settles instead of waiting for calls no job runs
    enough = [m for m in measured if m.decided]
    own = any(m.nccl_own for m in enough)
    # a departure no job has a verdict on (`judged`: the configurations the class's findings
    # name) is still to confirm (policy/runtime/exploration.py): the cell is not settled
    unjudged = any(m.is_departure and m.key not in judged for m in measured)
    settled = found or (own and len(enough) >= SETTLE_CONFIGS and not unjudged)
    return CellCoverage(
        collective=cid[3],
        size_bucket=cid[4],
        nranks=cid[1],
        nnodes=cid[2],
        settled=settled,
        measured=measured[:MAX_MEASURED],
    )


def _departures(cells: Sequence[CellCoverage]) -> list[Departure]:
    out = [
        Departure(
            collective=c.collective,
            size_bucket=c.size_bucket,
            nranks=c.nranks,
            nnodes=c.nnodes,
            algo=m.algo,
            proto=m.proto,
            nchannels=m.nchannels,
            chunk_bytes=m.chunk_bytes,
            speedup=m.speedup,
            calls=m.calls,
            jobs=m.jobs,
            adopted=m.as_table >= MIN_CALLS,
        )
        for c in cells
        for m in c.measured
        if m.is_departure
    ]
    out.sort(key=lambda d: (not d.adopted, -d.speedup * d.calls))
    return out[:MAX_DEPARTURES]


def disputed_cells(rows: Iterable[Measured]) -> set[tuple[str, int]]:
    """(collective, bucket) of the cells where a finding may be: a configuration other than
    NCCL's own pooled at a departure's speed, or run as a table's choice (a finding in use:
    later measurements may withdraw it)."""
    out = set()
    for cid, cell in _fold(rows).items():
        ref = _reference_us(cell)
        for a in cell.configs.values():
            fast = a.time_us > 0 and ref * a.calls / a.time_us >= 1 + DEPARTURE_MARGIN
            if a.own < MIN_CALLS and a.calls >= MIN_CALLS and (fast or a.table >= MIN_CALLS):
                out.add((cid[3], cid[4]))
    return out


def class_coverage(
    rows: Iterable[Measured],
    jobs: Mapping[str, int],
    found: Mapping[str, list[Finding]] | None = None,
) -> list[ClassCoverage]:
    """Per hardware class (most jobs first): cells by calls, settled cells, departures,
    findings (`found`, per class: operator/learning/findings.py)."""
    found = found or {}
    held = {
        (hw, f.nranks, f.nnodes, f.collective, f.size_bucket)
        for hw, fs in found.items()
        for f in fs
        if f.holds
    }
    judged: dict[CellId, set[ConfigKey]] = defaultdict(set)
    for hw, fs in found.items():
        for f in fs:
            judged[(hw, f.nranks, f.nnodes, f.collective, f.size_bucket)].add(f.key)
    per_class: dict[str, list[tuple[int, CellCoverage]]] = defaultdict(list)
    for cid, cell in _fold(rows).items():
        cov = _coverage(cid, cell, cid in held, judged.get(cid, set()))
        per_class[cid[0]].append((cell.calls, cov))
    out = []
    for hw, items in per_class.items():
        cells = [c for _, c in sorted(items, key=lambda x: -x[0])]
        out.append(
            ClassCoverage(
                hardware_class=hw,
                jobs=jobs.get(hw, 0),
                cells_measured=len(cells),
                cells_settled=sum(c.settled for c in cells),
                departures=_departures(cells),
                cells=cells[:MAX_CELLS],
                findings=found.get(hw, []),
            )
        )
    out.sort(key=lambda c: (-c.jobs, c.hardware_class))
    return out[:MAX_CLASSES]


def retrain_rows(model: ModelVersion | None) -> RetrainRows | None:
    """Rows read / used / skipped (by reason) of a model trained from the store."""
    if model is None or "offline/records" not in model.metrics:
        return None
    m = model.metrics
    skipped = {
        k.removeprefix("offline/skipped_"): int(v)
        for k, v in m.items()
        if k.startswith("offline/skipped_")
    }
    return RetrainRows(
        model_version=model.version,
        rows_read=int(m["offline/records"]),
        rows_used=int(m.get("offline/used", 0)),
        rows_skipped=skipped,
    )


def canary_percent(policy: Mapping[str, Any]) -> int:
    """The canary share of the registry's canary: the pinned canary's, else retraining's."""
    spec = policy.get("spec") or {}
    model = spec.get("model") or {}
    if model.get("canaryVersion"):
        return int(model.get("canaryPercent", 0))
    return int((spec.get("retraining") or {}).get("canaryPercent", 20))


def learning_status(
    rows: Iterable[Measured],
    jobs: Mapping[str, int],
    model: ModelVersion | None,
    cursor: int,
    rollout: RolloutStatus | None = None,
    *,
    found: Mapping[str, list[Finding]] | None = None,
) -> LearningStatus:
    """The whole `status.learning`."""
    return LearningStatus(
        rollout=rollout or RolloutStatus(),
        retrain=retrain_rows(model),
        hardware_classes=class_coverage(rows, jobs, found),
        experience_cursor=cursor,
    )


def rules(policy: Mapping[str, Any]) -> findings_mod.Rules:
    """The policy's confirmation rules (`exploration.confirmJobs`, `confirmNamespaces`)."""
    ex = Exploration.model_validate((policy.get("spec") or {}).get("exploration") or {})
    return findings_mod.Rules(ex.confirm_jobs, ex.confirm_namespaces)


def listed_cells(policy: Mapping[str, Any]) -> set[tuple[str, int]]:
    """(collective, bucket) of the findings the policy's `status.learning` lists now (none
    when it is missing or unreadable)."""
    seen = (policy.get("status") or {}).get("learning")
    if not isinstance(seen, Mapping):
        return set()
    try:
        status = LearningStatus.model_validate(seen)
    except ValidationError:
        return set()
    return {(f.collective, f.size_bucket) for c in status.hardware_classes for f in c.findings}


def class_findings(
    store: ExperienceStore, rows: Iterable[Measured], policy: Mapping[str, Any]
) -> dict[str, list[Finding]]:
    """Every class's findings, from per-job evidence of the cells where one may be: those
    the pooled numbers dispute, and those where a finding was listed already, so that one
    job's made-up calls, which move the pooled numbers anywhere, cannot make a claimed or
    held gain vanish before the jobs' own verdicts judge it."""
    b = store.backend
    return findings_mod.findings(
        evidence.job_measures(b, disputed_cells(rows) | listed_cells(policy)),
        evidence.guardrail_reverts(b),
        evidence.class_namespaces(b),
        rules(policy),
        {(uid, (*r.cell, r.config)) for uid, r in step_store.refusals(b)},
    )


def stored(doc: Any) -> Any:
    """What the API server keeps of ``doc`` written by a JSON merge patch: its maps without
    their null members (a null deletes; lists are kept as they are)."""
    if isinstance(doc, Mapping):
        return {k: stored(v) for k, v in doc.items() if v is not None}
    return doc


def status_patch(current: Mapping[str, Any] | None, fresh: LearningStatus) -> dict[str, Any] | None:
    """The merge patch for the policy's status, None when nothing changed."""
    doc = fresh.model_dump(mode="json", by_alias=True)
    if (current or {}).get("learning") == stored(doc):
        return None
    # a merge patch merges maps: replace `learning` whole (null first would cost a write)
    return {"status": {"learning": doc}}


def sync(
    store: ExperienceStore,
    registry: ModelRegistry,
    api: ClusterAPI,
    policies_res: Resource,
    policy: Mapping[str, Any],
) -> bool:
    """Recompute the primary policy's `status.learning`; patch it when it changed."""
    status = policy.get("status") or {}
    cursor = store.max_experience_id()
    trained = [m for m in registry.list() if "offline/records" in m.metrics]
    newest = trained[-1] if trained else None
    promoted = registry.current(ModelStatus.PROMOTED)
    canary = registry.current(ModelStatus.CANARY)
    rollout = RolloutStatus(
        promoted=promoted.version if promoted else None,
        canary=canary.version if canary else None,
        canary_percent=canary_percent(policy) if canary else 0,
    )
    seen = (status.get("learning") or {}) if isinstance(status.get("learning"), dict) else {}
    same_model = (seen.get("retrain") or {}).get("modelVersion") == (newest and newest.version)
    same_rollout = seen.get("rollout") == stored(rollout.model_dump(mode="json", by_alias=True))
    if seen.get("experienceCursor") == cursor and same_model and same_rollout:
        return False
    rows = measured(store.backend)
    fresh = learning_status(
        rows, class_jobs(store.backend), newest, cursor, rollout,
        found=class_findings(store, rows, policy),
    )  # fmt: skip
    patch = status_patch(status, fresh)
    if patch is None:
        return False
    api.patch(policies_res, policy["metadata"]["name"], patch, status=True)
    return True

"""The learning loop's controller: rewards → TuningRun status, retraining, registration, rollout.

It runs where the experience store is (the ingest process, which mounts the
store's volume), one `tick()` every few tens of seconds:

1. TuningRun status of every job that reported since the last tick
   (operator/learning/reward_status.py), merge-patched through the status subresource;
   the job's state features from the patched TuningRun go into the store once
   (operator/learning/features_sync.py), what a retrain conditions its rows on.
   Its step times are judged on the way (operator/learning/step_verdicts.py): the
   step-time speedup goes into the status, and a change whose collectives got faster
   while the steps got slower is stored as refused (findings and retraining skip it).
2. Registration: a retraining Job that succeeded has its model registered as
   a `candidate` after its digest is checked (operator/store/registry.py) —
   the Job wrote it on the shared volume.
3. Env knobs (operator/learning/knob_loop.py): each job's knob arm is recorded and the
   per-cohort comparison goes into every learned policy's `status.envKnobs`.
4. Rollout (operator/learning/canary.py): canary start / promotion / rollback.
5. Retraining (operator/learning/retrain.py): if due for the primary policy, a Job
   `dynamiccl train --from-store ...` is created, fine-tuning the version
   promoted now.
6. Learning status (operator/learning/learning_status.py): the primary policy's
   `status.learning` — rows the last retrain used and skipped by reason, and per
   hardware class what measurements settled (read by the operator to share out
   exploration between jobs).

One model lineage serves the release; the *primary* policy (mode `learned`,
highest priority, then name) supplies retraining settings and the canary share.
Only the policies that select the jobs whose rewards this store holds are
considered (operator/learning/policy_scope.py): another release's policies in the
same cluster are neither followed nor written.
The Kubernetes API is reached through `ClusterAPI` — the operator's adapter
(operator/kube.py `Kube`) satisfies it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from dynamiccl import constants as c
from dynamiccl.api.registry import ModelStatus, ModelVersion
from dynamiccl.api.tuning_policy import Retraining
from dynamiccl.operator.cluster_api import ClusterAPI
from dynamiccl.operator.controller.configmap import object_name
from dynamiccl.operator.kube import NAMESPACES, NotFoundError, Resource
from dynamiccl.operator.learning import features_sync, knob_loop, learning_status, policy_scope
from dynamiccl.operator.learning.canary import RolloutStep, advance_rollout
from dynamiccl.operator.learning.promotion import Criteria
from dynamiccl.operator.learning.retrain import (
    COMPONENT_LABEL,
    MODEL_VERSION_LABEL,
    POLICY_LABEL,
    RETRAIN_COMPONENT,
    RetrainDecision,
    RetrainSpec,
    build_retrain_job,
    model_version_name,
    retrain_due,
)
from dynamiccl.operator.learning.reward_status import reward_status
from dynamiccl.operator.learning.step_verdicts import judge_job
from dynamiccl.operator.store.coverage import job_configs
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.operator.store.registry import ModelRegistry, RegistryError

log = logging.getLogger("dynamiccl.operator.learning.loop")

JOBS: Final = Resource("batch", "v1", "jobs")
TUNING_RUNS: Final = Resource(c.GROUP, c.API_VERSION, "tuningruns")
POLICIES: Final = Resource(c.GROUP, c.API_VERSION, "nccltuningpolicies", namespaced=False)
FALLBACK_MODEL: Final = "default"


@dataclass(frozen=True)
class LoopConfig:
    """Deployment facts the loop needs."""

    namespace: str  # where retraining Jobs run (the operator's namespace)
    image: str
    store_url: str  # as the training pod sees it
    pvc_name: str
    store_url_secret: str | None = None  # the Job reads the URL from this Secret (key `url`)
    mount_path: str = "/var/lib/dynamiccl"  # the volume, in the training pod and here
    local_mount_path: str | None = None  # where THIS process sees the volume (default: same)
    service_account: str = "dynamiccl-train"
    colocate_with: Mapping[str, str] | None = None
    # the retraining Job's placement and size (retrain.py RetrainSpec)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    cpu: str = "2"
    memory: str = "4Gi"
    criteria: Criteria = field(default_factory=Criteria)


@dataclass
class TickReport:
    """What one tick did."""

    statuses_patched: int = 0
    step_refusals: int = 0  # changes newly refused for a slower step
    knob_statuses_patched: int = 0
    features_recorded: int = 0
    learning_status_patched: bool = False
    retrain: RetrainDecision | None = None
    launched_job: str | None = None
    registered: list[str] = field(default_factory=list)
    rollout: RolloutStep | None = None
    errors: list[str] = field(default_factory=list)


def _ts(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _valid(policy: Mapping[str, Any]) -> bool:
    """Whether the policy's retraining settings validate (a cron schedule that cannot be
    parsed or never fires: the operator ignores such a policy, so does the loop, instead
    of failing on it every pass)."""
    try:
        Retraining.model_validate((policy.get("spec") or {}).get("retraining") or {})
    except ValidationError as exc:
        name = (policy.get("metadata") or {}).get("name")
        log.warning("policy %s is invalid, ignored: %s", name, str(exc).splitlines()[:3])
        return False
    return True


def primary_policy(policies: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The valid learned policy with the highest priority (ties: name)."""
    learned = [
        p
        for p in policies
        if (p.get("spec") or {}).get("mode", "learned") == "learned" and _valid(p)
    ]
    if not learned:
        return None
    return sorted(
        learned,
        key=lambda p: (-int((p.get("spec") or {}).get("priority", 0)), p["metadata"]["name"]),
    )[0]


class LearningLoop:
    """See the module docstring; `tick()` is safe to call from one thread at a time."""

    def __init__(
        self,
        store: ExperienceStore,
        registry: ModelRegistry,
        api: ClusterAPI,
        config: LoopConfig,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.registry = registry
        self.api = api
        self.cfg = config
        self._clock = clock
        self._synced_until = 0.0
        self.synced_runs: list[dict[str, Any]] = []  # the TuningRuns the last sync patched
        self.job_scope: set[policy_scope.JobScope] = set()  # (namespace, kind) of stored jobs
        self.step_refusals = 0  # changes refused for a slower step (step_verdicts.py), so far

    # --- 1. TuningRun status ------------------------------------------------------------
    def sync_tuning_runs(self, errors: list[str] | None = None) -> int:
        """Patch the status of every job that reported since the previous sync.

        One job's failure (its patch refused, its summary unreadable) is logged and
        appended to `errors`; the other jobs are still patched and the cursor still
        advances, so one bad record can never stall every job's status.
        """
        now = self._clock()
        patched = 0
        self.synced_runs = []
        for ns, kind, name, uid in self.store.jobs_updated_since(self._synced_until):
            self.job_scope.add((ns, kind))  # the first sync reads every job of the store
            try:
                configs = job_configs(self.store.backend, uid)
                steps, refused = judge_job(self.store.backend, uid, ns, now)
                self.step_refusals += refused
                patch = reward_status(self.store.job_summary(uid), configs, steps).patch()
                run = self.api.patch(TUNING_RUNS, object_name(name), patch, ns, status=True)
                self.synced_runs.append(run)
                patched += 1
            except NotFoundError:
                log.debug("no TuningRun for %s/%s", ns, name)
            except Exception as exc:
                msg = f"status of {ns}/{name}: {type(exc).__name__}: {str(exc)[:300]}"
                log.warning("learning loop: %s", msg)
                if errors is not None:
                    errors.append(msg)
        self._synced_until = now - 1.0  # overlap: a batch committed during this sync is not lost
        return patched

    # --- 2. retraining ------------------------------------------------------------------
    def _retrain_jobs(self, policy: str) -> list[dict[str, Any]]:
        selector = f"{COMPONENT_LABEL}={RETRAIN_COMPONENT},{POLICY_LABEL}={policy[:63]}"
        return self.api.list(JOBS, self.cfg.namespace, selector)

    def collect_trained(self, policy: str) -> list[ModelVersion]:
        """Register the model of every succeeded retraining Job not registered yet."""
        out = []
        base = Path(self.cfg.local_mount_path or self.cfg.mount_path) / "models"
        for job in self._retrain_jobs(policy):
            version = (job["metadata"].get("labels") or {}).get(MODEL_VERSION_LABEL)
            if not version or not (job.get("status") or {}).get("succeeded"):
                continue
            if self.registry.get(version) is not None:
                continue
            out.append(self.registry.register_trained(base / version))
        return out

    def maybe_retrain(self, policy: dict[str, Any]) -> tuple[RetrainDecision, str | None]:
        """Start a retraining Job when the trigger rule says so."""
        meta, spec = policy["metadata"], policy.get("spec") or {}
        jobs = self._retrain_jobs(meta["name"])
        running = any(not _finished(j) for j in jobs)
        starts = [t for j in jobs if (t := _ts(j["metadata"].get("creationTimestamp")))]
        retraining = spec.get("retraining") or {}
        decision = retrain_due(
            now_unix_s=self._clock(),
            schedule=retraining.get("schedule"),
            min_new_experience=int(retraining.get("minNewExperience", 10_000)),
            new_rows=self.store.count_experience(self.registry.last_experience_cursor()),
            last_started_unix_s=max(starts) if starts else None,
            policy_created_unix_s=_ts(meta.get("creationTimestamp")) or 0.0,
            running=running,
        )
        if not decision.due:
            return decision, None
        promoted = self.registry.current(ModelStatus.PROMOTED)
        manifest = build_retrain_job(
            RetrainSpec(
                policy_name=meta["name"],
                policy_uid=meta["uid"],
                namespace=self.cfg.namespace,
                image=self.cfg.image,
                store_url=self.cfg.store_url,
                new_version=model_version_name(
                    meta["name"], dt.datetime.fromtimestamp(self._clock(), dt.UTC)
                ),
                parent_version=promoted.version if promoted else FALLBACK_MODEL,
                pvc_name=self.cfg.pvc_name,
                store_url_secret=self.cfg.store_url_secret,
                mount_path=self.cfg.mount_path,
                service_account=self.cfg.service_account,
                colocate_with=self.cfg.colocate_with,
                node_selector=self.cfg.node_selector,
                tolerations=self.cfg.tolerations,
                cpu=self.cfg.cpu,
                memory=self.cfg.memory,
            )
        )
        self.api.create(JOBS, manifest)
        return decision, str(manifest["metadata"]["name"])

    def scoped_policies(self) -> list[dict[str, Any]]:
        """The policies that select the jobs whose rewards this store holds (none before
        the first job reports: the loop then never touches another release's policies)."""
        if not self.job_scope:
            return []
        labels = policy_scope.labels_by_namespace(self.api.list(NAMESPACES))
        return policy_scope.in_scope(self.api.list(POLICIES), self.job_scope, labels)

    # --- the whole tick -----------------------------------------------------------------
    def tick(self) -> TickReport:
        """One pass of 1-5; errors are collected, never raised (the loop must keep going)."""
        rep = TickReport()
        try:
            before = self.step_refusals
            rep.statuses_patched = self.sync_tuning_runs(rep.errors)
            rep.step_refusals = self.step_refusals - before
        except Exception as exc:
            rep.errors.append(f"status sync: {exc}")
        try:
            rep.features_recorded = features_sync.record_from_runs(
                self.store, self.synced_runs, now=self._clock()
            )
        except Exception as exc:
            rep.errors.append(f"job features: {exc}")
        try:
            policies = self.scoped_policies()
            policy = primary_policy(policies)
        except Exception as exc:
            rep.errors.append(f"list policies: {exc}")
            return rep
        try:
            rep.knob_statuses_patched = knob_loop.step(
                self.store,
                self.api,
                POLICIES,
                policies=policies,
                runs=self.synced_runs,
                now=self._clock(),
            )
        except Exception as exc:
            rep.errors.append(f"env-knob experiment: {exc}")
        if policy is None:
            return rep
        try:
            rep.registered = [m.version for m in self.collect_trained(policy["metadata"]["name"])]
        except (RegistryError, OSError, RuntimeError) as exc:
            rep.errors.append(f"register trained model: {exc}")
        canary_percent = learning_status.canary_percent(policy)
        try:
            rep.rollout = advance_rollout(
                self.registry,
                self.store,
                canary_percent=canary_percent,
                criteria=self.cfg.criteria,
            )
        except Exception as exc:
            rep.errors.append(f"rollout: {exc}")
        try:  # after the rollout: a new run fine-tunes the version promoted just now
            rep.retrain, rep.launched_job = self.maybe_retrain(policy)
        except Exception as exc:
            rep.errors.append(f"retrain: {exc}")
        try:
            rep.learning_status_patched = learning_status.sync(
                self.store, self.registry, self.api, POLICIES, policy
            )
        except Exception as exc:
            rep.errors.append(f"learning status: {exc}")
        return rep


def _finished(job: Mapping[str, Any]) -> bool:
    status = job.get("status") or {}
    if status.get("succeeded"):
        return True
    return any(
        cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True"
        for cond in status.get("conditions") or []
    )

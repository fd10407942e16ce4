"""Thin kopf handlers: gather inputs, call ``reconcile.decide``, write the outcome.

Only ``@kopf.on.event`` handlers: kopf then keeps no state on the user's job
objects (no finalizers, no progress annotations). Writes are idempotent; the
ConfigMap and TuningRun are owned by the job, so deleting the job removes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from dynamiccl import constants as c
from dynamiccl.api.crds import NCCL_TUNING_POLICY, NODE_TOPOLOGY, TUNING_RUN
from dynamiccl.api.tuning_policy import JobKind
from dynamiccl.operator import metrics
from dynamiccl.operator.controller import (
    configmap,
    jobkinds,
    reconcile,
    sidecar_access,
    topo_files,
    tuningrun,
)
from dynamiccl.operator.controller.cache import ObjectCache
from dynamiccl.operator.controller.job_events import AppliedJobs, BoundPods, job_fingerprint
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.controller.upsert import upsert
from dynamiccl.operator.kube import (
    CONFIGMAPS,
    NAMESPACES,
    PODS,
    ROLEBINDINGS,
    ROLES,
    ConflictError,
    Kube,
    NotFoundError,
    Resource,
)

log = logging.getLogger("dynamiccl.operator.controller.handlers")
CHOSEN_KEPT = 65536  # fresh model choices remembered until the cache has their ConfigMap

TUNING_RUNS = Resource(TUNING_RUN.group, TUNING_RUN.version, TUNING_RUN.plural)
POLICIES = Resource(
    NCCL_TUNING_POLICY.group, NCCL_TUNING_POLICY.version, NCCL_TUNING_POLICY.plural, False
)
NODE_TOPOLOGIES = Resource(NODE_TOPOLOGY.group, NODE_TOPOLOGY.version, NODE_TOPOLOGY.plural, False)


@dataclass
class Reconciler:
    """Applies decisions for jobs; caches are shared with the webhook."""

    kube: Kube
    config_maps: ObjectCache
    policies: ObjectCache
    nodes: ObjectCache
    node_topologies: ObjectCache
    ingest_ca: str = ""
    compiler: configmap.Compiler | None = None  # None: the shipped model only
    retry_after_s: float = 30.0  # a job whose model could not be had is reconciled again
    bind_coalesce_s: float = 0.5  # pod bindings within this of the first: one pass
    _pending: dict[tuple[str, str, str], asyncio.Task[None]] = field(default_factory=dict)
    _bound_again: set[tuple[str, str, str]] = field(default_factory=set)
    applied: AppliedJobs = field(default_factory=AppliedJobs)
    _topo_memo: tuple[int, dict[str, str], topo_files.TopoData] | None = None
    # the canary's share by count (policy_match.choose_model): jobs given a model while each
    # canary version ran, and the models given, until their ConfigMap reaches the cache
    canary_seen: dict[str, int] = field(default_factory=dict)
    _chosen: OrderedDict[str, tuple[str, bool]] = field(default_factory=OrderedDict)
    _choosing: threading.Lock = field(default_factory=threading.Lock)

    def inputs(self, job: Mapping[str, Any]) -> reconcile.Inputs | None:
        """Blocking: the job's decision inputs (None when it does not want tuning)."""
        meta = job.get("metadata") or {}
        ns, uid = str(meta.get("namespace", "")), str(meta.get("uid", ""))
        try:
            ns_labels = (self.kube.get(NAMESPACES, ns).get("metadata") or {}).get("labels") or {}
        except NotFoundError:
            ns_labels = {}
        if not reconcile.wants_tuning(job, ns_labels):
            return None
        cm = self._config_map(job)
        previous_model = (configmap.read_model(cm, uid) if cm else None) or self._chosen.get(uid)
        chosen = previous_model is not None  # else the model is chosen now, kept for life
        pols, errors = parse_policies(self.policies.values() if chosen else self._policies_now())
        selector = self._pod_selector(job)
        pods = self.kube.list(PODS, ns, selector) if selector else []
        files, data = self._cluster_topo_files()
        bound = {str((p.get("spec") or {}).get("nodeName")) for p in pods}
        nodes = {n: o for n in bound if (o := self.nodes.get("", n)) is not None}
        topos = {n: o for n in bound if (o := self.node_topologies.get("", n)) is not None}
        return reconcile.Inputs(
            job=job,
            namespace_labels=ns_labels,
            policies=pols,
            policy_errors=errors,
            pods=pods,
            nodes=nodes,
            node_topologies=topos,
            cluster_nodes=self.nodes.values()[:512],
            ingest_ca=self.ingest_ca,
            compiler=self.compiler,
            previous_env=configmap.read_previous_env(cm, uid) if cm else None,
            previous_model=previous_model,
            previous_config=self._compiled_config_map(cm, uid),
            now_unix_s=time.time(),
            topo_files=files,
            topo_data=data,
        )

    def _compiled_config_map(
        self, cached: Mapping[str, Any] | None, uid: str
    ) -> dict[str, Any] | None:
        """The job's ConfigMap with its table, when an earlier compile for this job may be kept
        (configmap.py `kept_table`): the cache keeps no tables, so it is read from the apiserver
        (one GET per reconcile of a running job, none for a new one; `upsert` patches from
        it instead of reading it again)."""
        if cached is None or not configmap.is_of_job(cached, uid):
            return None
        meta = cached.get("metadata") or {}
        try:
            return self.kube.get(CONFIGMAPS, str(meta.get("name")), str(meta.get("namespace")))
        except NotFoundError:
            return None

    def _cluster_topo_files(self) -> tuple[dict[str, str], topo_files.TopoData]:
        """The cluster's topology files (node -> XML) and the ConfigMap keys they make, built
        again only when the NodeTopology cache changed: every job's ConfigMap carries the
        same ones, and building them is O(nodes) (12 500 NodeTopologies: ~2/3 of a job's
        reconcile, benchmarks/operator_inmemory_bench.py)."""
        version = self.node_topologies.version  # read first: a change after it rebuilds
        if self._topo_memo is None or self._topo_memo[0] != version:
            files = topo_files.node_files(
                {str(o["metadata"]["name"]): o for o in self.node_topologies.values()}
            )
            self._topo_memo = (version, files, topo_files.config_map_data(files))
        return self._topo_memo[1], self._topo_memo[2]

    def _policies_now(self) -> list[dict[str, Any]]:
        """The policies as the apiserver has them now, for a job without a model version yet
        (no ConfigMap of its own uid naming one).

        Its model version is chosen then and kept for life, so it is chosen from the
        policies' ``status.learning`` read from the apiserver, not from the watch cache: a
        job created after a promotion was written gets the promoted model however far the
        watch lags (an integration run on a loaded machine saw the cache hand a new job the
        old model, kept for good). One list of a handful of cluster objects per new job."""
        return self.kube.list(POLICIES)

    def _config_map(self, job: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = job.get("metadata") or {}
        return self.config_maps.get(
            str(meta.get("namespace", "")), configmap.object_name(str(meta.get("name", "")))
        )

    @staticmethod
    def _pod_selector(job: Mapping[str, Any]) -> str:
        name = (job.get("metadata") or {}).get("name", "")
        kind = jobkinds.kind_of(job)
        if kind in (JobKind.JOBSET, JobKind.TRAINJOB):
            return f"{c.LABEL_JOBSET_NAME}={name}"
        return f"{c.LABEL_KUBEFLOW_JOB_NAME}={name}"

    def apply(self, job: Mapping[str, Any]) -> str:
        """Blocking: decide and write for one job; returns the outcome label.

        A finished job is left as it ended: its TuningRun keeps the policy, model and
        outcome it ran with, whatever the policies say now (a deleted policy, a new one).
        """
        if jobkinds.finished(job):
            return "finished"
        inp = self.inputs(job)
        meta = job.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        cm_name = configmap.object_name(name)
        if inp is None:
            if self.config_maps.get(ns, cm_name) is not None:
                self.kube.delete(CONFIGMAPS, cm_name, ns)
            return "ignored"
        outcome = self._decide(inp)
        if outcome is None:  # pragma: no cover - inputs() already checked
            return "ignored"
        if outcome.config_map is not None:
            if self.config_maps.get(ns, cm_name) is None:  # first tuned: sidecar access
                self._grant_sidecar_access(job)
            upsert(self.kube, CONFIGMAPS, outcome.config_map, inp.previous_config)
        elif self.config_maps.get(ns, cm_name) is not None:
            self.kube.delete(CONFIGMAPS, cm_name, ns)
        current = upsert(self.kube, TUNING_RUNS, outcome.tuning_run)
        status = current.get("status") or {}
        at = tuningrun.now()
        if reconcile.event_needed(outcome, status):
            self.kube.event(reconcile.event(outcome, at))
        new_status = tuningrun.status(outcome.decision, status, at)
        if new_status != status:
            self.kube.patch(TUNING_RUNS, cm_name, {"status": new_status}, ns, status=True)
        if outcome.model_unavailable:
            return "tuned-without-model"
        return "tuned" if outcome.decision.tuned else "untuned"

    def _decide(self, inp: reconcile.Inputs) -> reconcile.Outcome | None:
        """`reconcile.decide`; a job given its model now is counted for the canary's share
        (one at a time: two new jobs must not read the same count) and remembered, so that
        a reconcile before its ConfigMap reaches the cache gives it the same model."""
        if inp.previous_model is not None:
            return reconcile.decide(inp)
        with self._choosing:
            outcome = reconcile.decide(dataclasses.replace(inp, canary_seen=self.canary_seen))
            if outcome is not None and outcome.offered_canary is not None:
                seen = self.canary_seen.get(outcome.offered_canary, 0)
                self.canary_seen[outcome.offered_canary] = seen + 1
        d = outcome.decision if outcome is not None else None
        if d is not None and d.model_version:
            self._chosen[d.job.uid] = (d.model_version, d.canary)
            while len(self._chosen) > CHOSEN_KEPT:
                self._chosen.popitem(last=False)
        return outcome

    def _grant_sidecar_access(self, job: Mapping[str, Any]) -> None:
        """Coordination ConfigMaps + Role + RoleBinding (create only: never reset them).

        A refusal (the chart's RBAC trimmed, a quota) costs the job only its in-run
        table changes: it is logged and the job is tuned all the same.
        """
        ref = reconcile.job_ref(job)
        access = sidecar_access.build(
            ref,
            sidecar_access.service_accounts(job),
            sidecar_access.writer_pods(job),
            sidecar_access.pods(job),
        )
        writes = [(CONFIGMAPS, cm) for cm in access.config_maps]
        writes += [(ROLES, access.role), (ROLEBINDINGS, access.role_binding)]
        for res, body in writes:
            try:
                self.kube.create(res, body)
            except ConflictError:
                continue
            except RuntimeError as exc:
                log.warning(
                    "%s/%s: sidecar access not granted (%s); in-run table changes are off",
                    ref.namespace,
                    ref.name,
                    exc,
                )
                return

    async def reconcile(self, job: Mapping[str, Any], kind: str, *, force: bool = False) -> None:
        """Async wrapper with timing and metrics; errors are logged, never raised to kopf.

        Events that change nothing we read (the training operator updating the job's
        status) are skipped unless ``force`` (a pod got bound: the topology changed).
        """
        start = time.perf_counter()
        fp = job_fingerprint(job, self.policies.version)
        meta = job.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if meta.get("deletionTimestamp"):  # going away (GC removes what we wrote): no writes
            metrics.RECONCILES.labels(kind=kind, outcome="deleting").inc()
            return
        if not force and self.applied.unchanged(uid, fp):
            metrics.RECONCILES.labels(kind=kind, outcome="unchanged").inc()
            return
        try:
            outcome = await asyncio.to_thread(self.apply, job)
            if outcome == "tuned-without-model":  # its model may come: not settled, retried
                self.applied.forget(uid)
                self._retry_later(job, kind)
            else:
                self.applied.remember(uid, fp)
        except Exception:
            log.exception("reconcile %s failed", (job.get("metadata") or {}).get("name"))
            outcome = "error"
        metrics.RECONCILES.labels(kind=kind, outcome=outcome).inc()
        metrics.TUNED_JOBS.set(len(self.config_maps))
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - start)

    def _retry_later(self, job: Mapping[str, Any], kind: str) -> None:
        """Reconcile the job again (its current version, read then) in `retry_after_s`."""
        meta = job.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")), "model")
        if key in self._pending and not self._pending[key].done():
            return

        async def later() -> None:
            await asyncio.sleep(self.retry_after_s)
            info = jobkinds.info_for(str(job.get("apiVersion", "")), str(job.get("kind", "")))
            if info is None:  # pragma: no cover - only watched kinds get here
                return
            res = Resource(info.group, info.version, info.plural)
            try:
                current = await asyncio.to_thread(self.kube.get, res, key[1], key[0])
            except NotFoundError:
                return
            except Exception as exc:
                log.warning("%s/%s: model retry not done: %s", key[0], key[1], exc)
                return
            finally:
                self._pending.pop(key, None)  # a failing retry schedules the next one
            await self.reconcile(current, kind, force=True)

        self._pending[key] = asyncio.create_task(later())

    def job_of_pod(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """Blocking: the training job a pod belongs to (GET), or None."""
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace", ""))
        name = jobkinds.job_name_of_pod(pod)
        if name is None:
            return None
        try:
            candidates = jobkinds.job_candidates(pod)
        except jobkinds.JobShapeError:
            return None
        for info in candidates:
            try:
                return self.kube.get(Resource(info.group, info.version, info.plural), name, ns)
            except Exception:  # absent, or that version is not served here
                continue
        return None

    async def pod_bound(self, pod: Mapping[str, Any]) -> None:
        """A training pod got a node: refine its job's features (coalesced per job).

        A binding seen while a pass is running (its pod list may predate this pod) asks
        for one more pass; one seen while the pass still waits is covered by its list."""
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace")), str(jobkinds.job_name_of_pod(pod)), "")
        if key in self._pending and not self._pending[key].done():
            self._bound_again.add(key)
            return

        async def later() -> None:
            again = True
            while again:
                await asyncio.sleep(self.bind_coalesce_s)
                self._bound_again.discard(key)  # the pods are listed after this point
                job = await asyncio.to_thread(self.job_of_pod, pod)
                if job is not None:
                    await self.reconcile(job, str(job.get("kind")), force=True)
                again = key in self._bound_again

        for done in [k for k, t in self._pending.items() if t.done()]:
            del self._pending[done]
        self._pending[key] = asyncio.create_task(later())


def register(registry: kopf.OperatorRegistry, rec: Reconciler) -> None:
    """Register the event handlers on a kopf registry."""
    for info in jobkinds.WATCHED:

        async def on_job(
            body: Any, type: str | None = None, _k: str = info.kind.value, **_: Any
        ) -> None:
            if type == "DELETED":  # ownerReferences garbage-collect the ConfigMap and TuningRun
                rec.applied.forget(str((body.get("metadata") or {}).get("uid", "")))
                return
            await rec.reconcile(dict(body), _k)

        kopf.on.event(
            info.group,
            info.version,
            info.plural,
            registry=registry,
            id=f"job-{info.plural}-{info.version}",
        )(on_job)

    bound = BoundPods()

    async def on_pod(body: Any, type: str | None = None, **_: Any) -> None:
        if bound.first_binding(type, body):
            await rec.pod_bound(dict(body))

    for label in (c.LABEL_KUBEFLOW_JOB_NAME, c.LABEL_JOBSET_NAME):
        kopf.on.event(
            "", "v1", "pods", labels={label: kopf.PRESENT}, registry=registry, id=f"pods-{label}"
        )(on_pod)

"""Jobs in a row on one hardware class of the local control plane, learning between them (issue 21).

`make demo-cluster` runs this after `kube.start_services` (helm install; the
chart's operator and ingest with its learning loop as local processes). For
each job, in order:

1. `kubectl apply` of a PyTorchJob (1 master + 3 workers of 8 H100: one
   32-rank data-parallel communicator), suspended until the real operator
   wrote its ConfigMap: model version (the loop's rollout in the policy's
   `status.learning`: promoted, or the canary for `canaryPercent` % of jobs,
   a retrained version fetched by the operator from the ingest), the compiled
   table and the job's exploration assignment; the training operator creates
   the pods, the scheduler binds them to H100 nodes.
2. The job's calls through the real plugin `.so` beside the real sidecar
   (`harness_job.play_job`: `sidecar.runner.Runner` configured from the job's
   ConfigMap, with file coordination of its epochs), on a surface where Tree
   is 1.25x faster than Ring for all-reduce >= 32 MiB (`surface.Departure`:
   neither NCCL's cost model nor the shipped model knows it); the sidecar
   posts its rewards over HTTPS to the real ingest with the master pod's
   TokenRequest token (checked by TokenReview). Then the pods are marked Succeeded
   (as their kubelet would; kwok runs no containers), the training operator completes it.
3. The learning loop (in the ingest process) writes the TuningRun's reward and
   exploration status, the job's features into the store, the policy's
   `status.learning`; when retraining is due it creates the retraining Job,
   whose pod cannot run on a kwok node (and whose store volume is a local
   directory here): `RetrainPod` plays that pod — runs its container's command
   with its environment as a local process, then sets the pod's phase — and
   the real Job controller completes the Job; the loop registers the model and
   starts its canary; the sequential judge promotes or rolls back.

Stand-ins: the pods' containers (one rank of one pod plays the communicator
beside the master pod's sidecar, whose threads are stepped on the job's clock;
file coordination instead of the apiserver's; times from the simulator with the
departure: see harness_job.py) and the retraining pod's container (a local
process). Everything else is the real component.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.table import DecisionTable, scale_class, size_bucket
from dynamiccl.demo import story
from dynamiccl.demo.harness_job import JobSpec, play_job
from dynamiccl.demo.kube_manifests import NAMESPACE, POLICY, SYSTEM_NS, sequence_job
from dynamiccl.demo.learning_run import table_of
from dynamiccl.demo.sequence import STEP
from dynamiccl.operator.learning.retrain import (
    COMPONENT_LABEL,
    MODEL_VERSION_LABEL,
    RETRAIN_COMPONENT,
)
from dynamiccl.sidecar.sender import Client
from dynamiccl.testing.surface import Departure, Surface
from dynamiccl.testing.workload import Op, TimeTable, build_time_table

Say = Callable[[str], None]
POD_GONE: Final = ("Succeeded", "Failed")


@dataclass
class SequenceSettings:
    jobs: int = 8
    calls: int = 100_000
    departure: Departure | None = field(default_factory=Departure)
    budget_percent: float = 1.0
    wait_s: float = 180.0
    # wait for a running retrain (and its canary) before the next job: every job then runs the
    # newest model (tests); otherwise jobs go on while it trains, as in a cluster
    wait_for_retrain: bool = False


class RetrainPod:
    """Plays the retraining Job's pod: its container's command and environment, run here."""

    def __init__(self, cl: Any, pod: Mapping[str, Any], log: Path) -> None:
        self.cl, self.pod = cl, pod
        self.name = str(pod["metadata"]["name"])
        self.version = str((pod["metadata"].get("labels") or {}).get(MODEL_VERSION_LABEL, ""))
        container = pod["spec"]["containers"][0]
        cmd = [str(a) for a in container["command"]]
        env = {**os.environ, **self._env(container.get("env") or [])}
        env["HOME"] = tempfile.mkdtemp(prefix="retrain-home-")  # the pod's /tmp emptyDir
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dynamiccl.cli", *cmd[1:]],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        self.started = time.monotonic()

    def _env(self, items: list[Mapping[str, Any]]) -> dict[str, str]:
        out: dict[str, str] = {}
        for e in items:
            if "value" in e:
                out[str(e["name"])] = str(e["value"])
                continue
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                secret = self.cl.core.read_namespaced_secret(ref["name"], SYSTEM_NS)
                out[str(e["name"])] = base64.b64decode(secret.data[ref["key"]]).decode()
        return out

    def finish(self) -> bool | None:
        """None while running; else the pod's phase is set (as its kubelet would) and the
        result returned."""
        code = self.proc.poll()
        if code is None:
            return None
        phase = "Succeeded" if code == 0 else "Failed"
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        status = {"status": {"phase": phase, "containerStatuses": [{
            "name": "train", "image": "", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": term},
        }]}}  # fmt: skip
        try:
            self.cl.core.patch_namespaced_pod_status(self.name, SYSTEM_NS, status)
        except self.cl.api_error as exc:  # the pod is gone (its Job deleted): nothing to report
            if getattr(exc, "status", None) != 404:
                raise
        return code == 0


def retrain_pods(cl: Any) -> list[dict[str, Any]]:
    sel = f"{COMPONENT_LABEL}={RETRAIN_COMPONENT}"
    items = cl.core.list_namespaced_pod(SYSTEM_NS, label_selector=sel).items
    return [cl.api.sanitize_for_serialization(p) for p in items]


def runs_departure(table: DecisionTable, feats: StateFeatures, d: Departure | None) -> bool:
    """Does the table choose the departed algorithm first in a departed cell of the job?"""
    d = d or Departure()
    sc = scale_class(feats.world_size, feats.topology.nodes)
    cells = {size_bucket(n) for col, n in STEP if col == d.collective and n >= d.min_bytes}
    chosen = [table.cell(d.collective, b, sc) for b in sorted(cells)]
    return any(x is not None and x.choices and x.choices[0].algo is d.faster for x in chosen)


def learning_of(cl: Any) -> dict[str, Any]:
    obj = cl.custom.get_cluster_custom_object(c.GROUP, c.API_VERSION, "nccltuningpolicies", POLICY)
    return dict((obj.get("status") or {}).get("learning") or {})


def outranked_by(cl: Any) -> list[str]:
    """Learned policies the learning loop would follow instead of the demo's (it follows the
    cluster's primary one: highest priority, then name), e.g. another release's tests."""
    from dynamiccl.operator.learning.loop import primary_policy  # noqa: PLC0415

    items = cl.custom.list_cluster_custom_object(c.GROUP, c.API_VERSION, "nccltuningpolicies")
    policies = [dict(p) for p in items.get("items") or []]
    first = primary_policy(policies)
    name = (first or {}).get("metadata", {}).get("name")
    return [] if name in (None, POLICY) else [str(name)]


def other_loops(cl: Any) -> list[str]:
    """Ingest Deployments of other DynamICCL releases: their learning loops also follow the
    cluster's primary learned policy and write its `status.learning` from their own registry."""
    apps: Any = cl.apps  # dynamic client shapes
    sel = "app.kubernetes.io/component=ingest"
    items = apps.list_deployment_for_all_namespaces(label_selector=sel).items
    names = [(str(d.metadata.namespace), str(d.metadata.name)) for d in items]
    return [f"{ns}/{name}" for ns, name in names if ns != SYSTEM_NS]


class ClusterSequence:
    """The jobs of the demo, one after another (see the module docstring)."""

    def __init__(self, cl: Any, out: Path, ingest_port: int, s: SequenceSettings, say: Say) -> None:
        self.cl, self.out, self.s, self.say = cl, out, s, say
        self.ingest_url = f"https://127.0.0.1:{ingest_port}{c.INGEST_PATH}"
        self.results: list[story.JobRow] = []
        self.retrains: list[RetrainPod] = []
        self._seen_pods: set[str] = set()
        self._times: dict[str, TimeTable] = {}
        self._rollout: story.Rollout = (None, None)
        self._held: set[tuple[Any, ...]] = set()  # the class's findings seen holding so far
        self.k = [cl.kubectl, "--kubeconfig", cl.kubeconfig, "-n", NAMESPACE]

    # --- the learning loop's side --------------------------------------------------------
    def _loop_events(self) -> list[str]:
        """Play new retraining pods, finish done ones; what changed in the rollout."""
        events: list[str] = []
        for pod in retrain_pods(self.cl):
            name = pod["metadata"]["name"]
            gone = (pod.get("status") or {}).get("phase") in POD_GONE
            if name in self._seen_pods or gone or pod["metadata"].get("deletionTimestamp"):
                continue
            self._seen_pods.add(name)
            rp = RetrainPod(self.cl, pod, self.out / "retrain.log")
            self.retrains.append(rp)
            events.append(f"retraining {rp.version} (Job's pod played here)")
        for rp in list(self.retrains):
            ok = rp.finish()
            if ok is None:
                continue
            self.retrains.remove(rp)
            took = time.monotonic() - rp.started
            events.append(
                f"retrained {rp.version} in {took:.0f} s" if ok else f"retrain {rp.version} FAILED"
            )
            if ok:  # the loop's next tick registers it and (no canary running) starts its canary
                self._await_rollout(rp.version)
        learning = learning_of(self.cl)
        changed, self._rollout = story.rollout_events(learning, self._rollout)
        return events + changed + story.new_findings(learning, self._held)

    def _await_rollout(self, version: str, timeout_s: float = 8.0) -> None:
        """A few loop ticks for the registered model to reach the rollout (a canary already
        running keeps it a candidate: then this just times out)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and version not in story.rollout_of(learning_of(self.cl)):
            time.sleep(0.5)

    def settle(self, timeout_s: float = 120.0) -> list[str]:
        """Wait for running retrains and the loop's registration of their models."""
        events: list[str] = []
        deadline = time.monotonic() + timeout_s
        while self.retrains and time.monotonic() < deadline:
            events += self._loop_events()
            time.sleep(1)
        time.sleep(3)  # a loop tick registers the model and starts its canary
        return events + self._loop_events()

    # --- one job -------------------------------------------------------------------------
    def _create(self, index: int) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        cl, doc = self.cl, sequence_job(index)
        name = doc["metadata"]["name"]
        cl.sh(*self.k, "delete", "pytorchjob", name, "--ignore-not-found", "--wait=true")
        cl.apply(doc)
        cm_name = f"{name}-dynamiccl"
        cl.wait(
            "the job's ConfigMap", lambda: cl.core.read_namespaced_config_map(cm_name, NAMESPACE)
        )
        patch = json.dumps({"spec": {"runPolicy": {"suspend": False}}})
        cl.sh(*self.k, "patch", "pytorchjob", name, "--type=merge", "-p", patch)
        sel = f"{c.LABEL_KUBEFLOW_JOB_NAME}={name}"
        want = 1 + int(doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])

        def running() -> list[Any]:
            items = cl.core.list_namespaced_pod(NAMESPACE, label_selector=sel).items
            ok = len(items) == want and all(p.status.phase == "Running" for p in items)
            return items if ok else []

        pods = [
            cl.api.sanitize_for_serialization(p) for p in cl.wait(f"{want} Running pods", running)
        ]
        tr = (c.GROUP, c.API_VERSION, NAMESPACE, "tuningruns", cm_name)
        cl.wait(
            "the TuningRun refined from the bound pods",
            lambda: cl.custom.get_namespaced_custom_object(*tr)["spec"]["features"]["scheduled"],
        )
        cm = cl.api.sanitize_for_serialization(
            cl.core.read_namespaced_config_map(cm_name, NAMESPACE)
        )
        job = dict(
            cl.custom.get_namespaced_custom_object(
                "kubeflow.org", "v1", NAMESPACE, "pytorchjobs", name
            )
        )
        return job, cm, pods

    def _surface(self, feats: StateFeatures, index: int) -> Surface:
        spec = feats.topology.spec()
        if spec.name not in self._times:
            ops = tuple(Op(col, n, 1, "") for col, n in dict.fromkeys(STEP))
            self._times[spec.name] = build_time_table(spec, ops)
        return Surface(self._times[spec.name], self.s.departure, seed=index)

    def _complete(self, pods: list[dict[str, Any]]) -> None:
        """The pods' containers exited 0 (what their kubelet would report)."""
        for p in pods:
            term = {"exitCode": 0, "reason": "Completed"}
            cs = [{"name": ct["name"], "image": ct.get("image", ""), "imageID": "", "ready": False,
                   "restartCount": 0, "state": {"terminated": term}}
                  for ct in p["spec"]["containers"]]  # fmt: skip
            body = {"status": {"phase": "Succeeded", "containerStatuses": cs}}
            self.cl.core.patch_namespaced_pod_status(p["metadata"]["name"], NAMESPACE, body)

    def _synced_run(self, name: str) -> dict[str, Any]:
        """The job's TuningRun once its reward counts every call of the job."""
        tr = (c.GROUP, c.API_VERSION, NAMESPACE, "tuningruns", f"{name}-dynamiccl")

        def synced() -> dict[str, Any] | None:
            run = dict(self.cl.custom.get_namespaced_custom_object(*tr))
            calls = int(((run.get("status") or {}).get("reward") or {}).get("calls") or 0)
            return run if calls >= self.s.calls else None

        got: dict[str, Any] = self.cl.wait("the TuningRun's reward", synced, timeout=self.s.wait_s)
        return got

    def learning(self) -> dict[str, Any]:
        return learning_of(self.cl)

    def run_job(self) -> story.JobRow:
        index = len(self.results) + 1
        events = self.settle(self.s.wait_s) if self.s.wait_for_retrain else self._loop_events()
        job, cm, pods = self._create(index)
        name = job["metadata"]["name"]
        meta = json.loads(cm["data"]["job.json"])
        feats = StateFeatures.model_validate_json(cm["data"]["features.json"])
        table = table_of(cm)
        if table is None:
            raise RuntimeError(f"{name}: no table ({cm['data'].get('table.json', '')[:200]})")
        master = sorted(pods, key=lambda p: p["metadata"]["name"])[0]
        token = self.out / "jobs" / name / "token"
        token.parent.mkdir(parents=True, exist_ok=True)
        token.write_text(self.cl.token(master))
        spec = JobSpec(
            namespace=NAMESPACE, name=name, uid=job["metadata"]["uid"],
            pod_name=master["metadata"]["name"], pod_uid=master["metadata"]["uid"],
            model_version=str(meta.get("model_version", "")), features=feats,
            step=[(col.nccl_id, n) for col, n in STEP], calls=self.s.calls,
        )  # fmt: skip
        client = Client(self.ingest_url, token, self.out / "tls" / "ca.crt")
        try:
            played = play_job(
                spec, cm["data"], self._surface(feats, index), self.out / "jobs" / name, client
            )
        finally:
            client.close()
        self._complete(pods)
        row = story.from_tuning_run(index, name, self._synced_run(name))
        row.played = played
        row.runs_departure = runs_departure(table, feats, self.s.departure)
        time.sleep(3)  # the loop's tick that synced the status decides on retraining too
        row.events = events + self._loop_events()
        self.results.append(row)
        return row


def run(cl: Any, out: Path, ingest_port: int, s: SequenceSettings, say: Say) -> story.Outcome:
    """Play `s.jobs` jobs in a row; print one line per job, then the outcome."""
    seq = ClusterSequence(cl, out, ingest_port, s, say)
    surface = s.departure.describe() if s.departure else "the simulator's (NCCL is right)"
    say(f"{s.jobs} jobs of {s.calls} calls, one after another; surface: {surface}")
    for loop in other_loops(cl):
        say(
            f"WARNING: another release's ingest {loop} runs a learning loop in this cluster: it "
            f"follows the same primary policy and may overwrite its status.learning (rollout)"
        )
    for other in outranked_by(cl):
        say(
            f"WARNING: the learning loop follows policy {other!r}, not the demo's: it outranks "
            f"{POLICY!r} (priority, then name); the demo's model will not be retrained"
        )
    t0 = time.monotonic()
    try:
        story.play(seq, s.jobs, lambda line: print(line, flush=True))
    finally:
        for rp in seq.retrains:  # a retraining still running: the demo is over
            if rp.proc.poll() is None:
                rp.proc.kill()
    faster = (s.departure or Departure()).faster.value
    res = story.outcome(seq.results, learning_of(cl), lambda f: f["algo"] == faster)
    print("\n".join(res.lines(f"{faster} measured faster", s.budget_percent)), flush=True)
    print(f"wall time: {time.monotonic() - t0:.0f} s for {s.jobs} jobs", flush=True)
    return res

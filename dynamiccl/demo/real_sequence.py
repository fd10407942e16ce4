"""Jobs in a row on the real node, learning between them (`make demo-cluster`'s default mode).

On the chart installed on `real-node-0` (`dynamiccl/testing/real_release.py`: operator, webhook,
ingest with its learning loop, store, node agent: the built images in real
containers), with a learned policy whose new models serve every new job first
(canary share 100 %), for each job in order:

1. a PyTorchJob of 2 Worker pods x 4 ranks on the real node, labelled as an
   8-GPU H100 NVSwitch node (`real_manifests.gpu_labels`): the real training
   operator creates the pods, the webhook injects the plugin and the sidecar,
   the operator compiles the job's table from its model version (the loop's
   rollout) and the class's findings (docs/learning-loop.md: a configuration
   several jobs measured faster than NCCL's own starts every new job, whatever
   its model) for the topology it observed;
2. the main container runs `harness_pod.py`: 4 rank processes that dlopen the
   plugin as NCCL does and play a DDP step (six 32 MiB all-reduces, one 6 KiB)
   on the simulator's surface where NVLS, NCCL's pick for 32 MiB, runs 1.8x
   slower than NCCL's model says (`real_manifests.DEPARTURE`); the sidecars
   explore within the policy's budget, agree tables through the epoch protocol
   and send rewards to the ingest Service;
3. the learning loop writes the TuningRun's speedup and exploration status and
   the class's findings. The story (issue 29): the first job's exploration
   measures Ring faster (one job's word: not trusted yet); the second job's
   exploration confirms it (the finding holds); the third job, on the parent
   model, starts with it. After that job the policy's retraining threshold is
   opened once (`minNewExperience: 1`, then back to 0): the loop's retraining
   Job runs the trainer image on the real node, the loop registers the model and
   starts its canary; the next jobs get the canary (and the finding); the
   sequential judge decides on the canary against its parent.

Stand-ins: no GPU (a call's time is the surface's; the node carries GPU labels),
and the retraining trigger (the demo opens the policy's threshold after the first
job that ran the finding, where a cluster would set a threshold or a schedule).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Algo, Collective
from dynamiccl.api.table import DecisionTable, scale_class, size_bucket
from dynamiccl.demo import story
from dynamiccl.operator.learning.retrain import MODEL_VERSION_LABEL, POLICY_LABEL
from dynamiccl.operator.webhook.mutate import SIDECAR
from dynamiccl.testing.real_manifests import (
    DEPARTURE,
    HARDENED_CONTAINER,
    NODE_NAME,
    NONROOT_POD,
    PODS,
    Harness,
    gpu_labels,
    harness_data,
    pytorchjob,
    times_data,
)
from dynamiccl.testing.real_node_sessions import SESSION_LABELS
from dynamiccl.testing.real_release import NS_LABEL
from dynamiccl.testing.workload import call_key

POLICY: Final = "dynamiccl-demo-real"
GPU_PRODUCT: Final = "NVIDIA-H100-80GB-HBM3"
NTP: Final = (c.GROUP, c.API_VERSION, "nccltuningpolicies")
BIG: Final = call_key(Collective.ALLREDUCE.nccl_id, int(DEPARTURE["min_bytes"]))
SLOW_ALGO: Final = Algo(DEPARTURE["algo"])
Say = Callable[[str], None]


@dataclass
class RealSettings:
    jobs: int = 6  # find, confirm, the parent with the finding, three on the canary
    steps: int = 1500  # of 7 calls, 20 ms each: 30 s of playing per job
    budget_percent: float = 5.0  # a 30-second job: room for the race to measure the arms
    job_timeout_s: float = 600.0


def policy(namespace_label: str, budget_percent: float) -> dict[str, Any]:
    """The demo's learned policy: its jobs' namespace, every new model a canary for all jobs,
    no retraining by count until the demo opens the threshold."""
    return {
        "apiVersion": f"{c.GROUP}/{c.API_VERSION}",
        "kind": "NCCLTuningPolicy",
        "metadata": {"name": POLICY, "labels": dict(SESSION_LABELS)},
        "spec": {
            "mode": "learned",
            "priority": 1000,
            "selector": {
                "namespaceSelector": {"matchLabels": {namespace_label: "jobs"}},
                "jobKinds": ["PyTorchJob"],
            },
            "exploration": {"seed": 7, "budgetPercent": budget_percent},
            "retraining": {"minNewExperience": 0, "canaryPercent": 100},
        },
    }


def avoids_departure(table: DecisionTable, scale: int) -> bool:
    """Does the table's first choice for the 32 MiB all-reduce (of the job's scale class) leave
    NVLS?"""
    cell = table.cell(Collective.ALLREDUCE, size_bucket(int(DEPARTURE["min_bytes"])), scale)
    return cell is not None and bool(cell.choices) and cell.choices[0].algo is not SLOW_ALGO


def off_nvls_share(summaries: list[dict[str, Any]]) -> float | None:
    """The share of the ranks' 32 MiB all-reduces that ran another algorithm than NVLS (None
    without a rank's summary). Every rank of the communicator runs the same choices."""
    arms: Counter[str] = Counter()
    for summary in summaries:
        arms.update(summary.get("decisions", {}).get(BIG, {}))
    total = sum(arms.values())
    off = sum(n for arm, n in arms.items() if int(arm.split(":")[0]) != SLOW_ALGO.nccl_id)
    return off / total if total else None


class RealSequence:
    """The demo's jobs on the real node (see the module docstring)."""

    def __init__(  # noqa: PLR0917 - the release's coordinates
        self, cl: Any, image: str, jobs_ns: str, system_ns: str, s: RealSettings, say: Say
    ) -> None:
        self.cl, self.image, self.ns, self.system_ns, self.s, self.say = (
            cl, image, jobs_ns, system_ns, s, say,
        )  # fmt: skip
        self.results: list[story.JobRow] = []
        self.logs: Path | None = None  # where each pod's sidecar log is kept (run() sets it)
        self.rollout: story.Rollout = (None, None)
        self.retrained: dict[str, Any] = {}
        self.held: set[tuple[Any, ...]] = set()  # the findings seen holding so far (their cells)

    # --- the cluster's side ----------------------------------------------------------------
    def _tuning_run(self, name: str) -> dict[str, Any]:
        tr = (c.GROUP, c.API_VERSION, self.ns, "tuningruns", f"{name}-dynamiccl")
        return dict(self.cl.custom.get_namespaced_custom_object(*tr))

    def _pods(self, name: str) -> list[Any]:
        sel = f"{c.LABEL_KUBEFLOW_JOB_NAME}={name}"
        items = self.cl.core.list_namespaced_pod(self.ns, label_selector=sel).items
        return sorted(items, key=lambda p: p.metadata.name)

    def _summaries(self, pod: str) -> list[dict[str, Any]]:
        log = self.cl.core.read_namespaced_pod_log(pod, self.ns, container="pytorch")
        out = []
        for line in str(log).splitlines():
            if line.startswith('{"summary"'):
                # the pod's 4 rank processes share its stdout: a long line may be cut by another's
                with contextlib.suppress(json.JSONDecodeError):
                    out.append(json.loads(line)["summary"])
        return out

    def learning(self) -> dict[str, Any]:
        obj = self.cl.custom.get_cluster_custom_object(*NTP[:2], NTP[2], POLICY)
        return dict((obj.get("status") or {}).get("learning") or {})

    def _rollout_events(self) -> list[str]:
        events, self.rollout = story.rollout_events(self.learning(), self.rollout)
        return events

    def _set_threshold(self, n: int) -> None:
        body = {"spec": {"retraining": {"minNewExperience": n}}}
        self.cl.custom.patch_cluster_custom_object(*NTP[:2], NTP[2], POLICY, body)

    def _retrain_jobs(self) -> list[Any]:
        sel = f"{POLICY_LABEL}={POLICY}"
        return list(self.cl.batch.list_namespaced_job(self.system_ns, label_selector=sel).items)

    def retrain(self) -> list[str]:
        """Open the threshold once: the loop's retraining Job on the real node, its canary."""
        t0 = time.monotonic()
        self._set_threshold(1)
        try:
            job = self.cl.wait("the retraining Job", self._retrain_jobs, 120)[-1]
        finally:
            self._set_threshold(0)
        name = job.metadata.name
        version = job.metadata.labels.get(MODEL_VERSION_LABEL, "")

        def finished() -> Any:
            j = next(x for x in self._retrain_jobs() if x.metadata.name == name)
            return j if (j.status.succeeded or j.status.failed) else None

        done = self.cl.wait(f"the retraining Job {name}", finished, 900)
        took = time.monotonic() - t0
        pod = self.cl.core.list_namespaced_pod(
            self.system_ns, label_selector=f"job-name={name}"
        ).items[-1]
        self.retrained = {
            "version": version, "job": name, "succeeded": bool(done.status.succeeded),
            "node": pod.spec.node_name, "image": pod.spec.containers[0].image,
            "trigger_to_finished_s": round(took, 1),
        }  # fmt: skip
        if not done.status.succeeded:
            return [f"retrain {version} FAILED (Job {name})"]
        self.cl.wait(
            f"the canary {version}", lambda: story.rollout_of(self.learning())[1] == version, 120
        )
        return [f"retrained {version} in {took:.0f} s (Job's pod on {pod.spec.node_name}, "
                f"{pod.spec.containers[0].image.rsplit(':', 1)[-1]})",
                *self._rollout_events()]  # fmt: skip

    # --- one job -----------------------------------------------------------------------------
    def _start(self, name: str, index: int) -> StateFeatures:
        data = harness_data(Harness(steps=self.s.steps, seed=index))
        cm = {"metadata": {"name": f"{name}-harness"}, "data": data}
        self.cl.core.create_namespaced_config_map(self.ns, cm)
        job = pytorchjob(name, self.image, NONROOT_POD, HARDENED_CONTAINER)
        self.cl.custom.create_namespaced_custom_object(
            "kubeflow.org", "v1", self.ns, "pytorchjobs", job
        )

        def scheduled() -> dict[str, Any] | None:
            feats = self._tuning_run(name)["spec"].get("features") or {}
            return feats if feats.get("scheduled") else None

        feats = StateFeatures.model_validate(
            self.cl.wait("the TuningRun with the pods' observed features", scheduled, 180)
        )
        _, times = times_data(feats)  # the surface of the topology the operator observed
        self.cl.core.create_namespaced_config_map(
            self.ns, {"metadata": {"name": f"{name}-times"}, "data": times}
        )
        return feats

    def _wait_done(self, name: str) -> list[Any]:
        def done() -> list[Any]:
            ps = self._pods(name)
            ok = len(ps) == PODS and all(p.status.phase in ("Succeeded", "Failed") for p in ps)
            return ps if ok else []

        pods: list[Any] = self.cl.wait(f"the pods of {name} to finish", done, self.s.job_timeout_s)
        failed = [p.metadata.name for p in pods if p.status.phase != "Succeeded"]
        if failed:
            raise RuntimeError(f"{name}: pods {failed} failed")
        return pods

    def _keep_sidecar_logs(self, pods: list[Any]) -> None:
        """Each pod's sidecar log, kept in the output directory: the pods go with the release."""
        if self.logs is None:
            return
        for p in pods:
            with contextlib.suppress(Exception):
                log = self.cl.core.read_namespaced_pod_log(
                    p.metadata.name, self.ns, container=SIDECAR
                )
                (self.logs / f"{p.metadata.name}.sidecar.log").write_text(str(log))

    def _synced_run(self, name: str) -> dict[str, Any]:
        """The job's TuningRun once the loop wrote its speedup."""

        def synced() -> dict[str, Any] | None:
            run = self._tuning_run(name)
            reward = (run.get("status") or {}).get("reward") or {}
            return run if reward.get("speedup") is not None else None

        got: dict[str, Any] = self.cl.wait(f"the speedup of {name}", synced, 180)
        return got

    def run_job(self) -> story.JobRow:
        """One job; after the first that ran the class's finding, the retrain (the story: a
        parent-model job with it first)."""
        index = len(self.results) + 1
        name = f"train-{index:02d}"
        feats = self._start(name, index)
        pods = self._wait_done(name)
        self._keep_sidecar_logs(pods)
        row = story.from_tuning_run(index, name, self._synced_run(name))
        cm = self.cl.core.read_namespaced_config_map(f"{name}-dynamiccl", self.ns)
        table = DecisionTable.model_validate_json(cm.data["table.json"])
        row.runs_departure = avoids_departure(
            table, scale_class(feats.world_size, feats.topology.nodes)
        )
        row.ran_departure = off_nvls_share(self._summaries(pods[0].metadata.name))
        time.sleep(6)  # a tick of the loop (5 s) after the sync: the judge has seen the job
        row.events = self._rollout_events() + story.new_findings(self.learning(), self.held)
        self.results.append(row)
        if self.retrained == {} and row.measured and index < self.s.jobs:
            row.events += self.retrain()
        return row


def run(seq: RealSequence, out: Path, images: dict[str, str]) -> dict[str, Any]:
    """The jobs in a row; one line per job, then the summary (also `out/summary.json`, with
    the `images` the release runs: hack/images.sh may build newer ones meanwhile)."""
    s, cl = seq.s, seq.cl
    seq.logs = out
    cl.core.patch_node(NODE_NAME, {"metadata": {"labels": gpu_labels(GPU_PRODUCT)}})
    cl.apply(policy(NS_LABEL, s.budget_percent))
    t0 = time.monotonic()
    seq.say(f"{s.jobs} jobs of {s.steps} steps (7 collectives each) on {NODE_NAME}, "
            f"labelled {GPU_PRODUCT} x8; surface: all-reduce >= 32 MiB with NVLS "
            f"{DEPARTURE['slower']}x slower than NCCL's model")  # fmt: skip
    try:
        story.play(seq, s.jobs, lambda line: print(line, flush=True))
    finally:
        labels = dict.fromkeys(gpu_labels(GPU_PRODUCT))
        cl.core.patch_node(NODE_NAME, {"metadata": {"labels": labels}})
    res = story.outcome(seq.results, seq.learning())
    rt = seq.retrained
    result = asdict(res) | {
        "retrain": rt, "jobs": [asdict(r) for r in seq.results],
        "wall_s": round(time.monotonic() - t0, 1), "images": images,
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(result, indent=1, default=str))
    lines = res.lines("NVLS measured slower at 32 MiB", s.budget_percent)
    lines.append(
        f"retrained: {rt.get('version', '-')} by the loop's Job on {rt.get('node', '-')} "
        f"({rt.get('image', '-')}), trigger to finished {rt.get('trigger_to_finished_s', '-')} s"
    )
    print("\n".join(lines), flush=True)
    print(f"wall time: {result['wall_s']:.0f} s for {s.jobs} jobs", flush=True)
    return result

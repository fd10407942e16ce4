"""`dynamiccl demo`, step by step: the whole loop on a simulated cluster, no Kubernetes, no GPU.

1. The simulated cluster (`examples/topology-aws-p5-2node.yaml`), the sample
   NCCLTuningPolicies (`examples/policies/`), an experience store (SQLite) with
   the shipped model registered as `default`, the reward ingest over HTTPS.
2. Run 1: the annotated PyTorchJob (`examples/pytorchjob.yaml`) goes through
   the operator's decision and the admission webhook; its pods run: sidecars
   (`dynamiccl sidecar`) and 16 rank processes driving the real plugin `.so`,
   times from the simulator; rewards flow through the ingest into the store.
3. The learning loop's turn (`LearningLoop.tick`, as in a cluster): the
   TuningRun's status, the job's features into the store, a retraining Job
   (its command, `dynamiccl train --from-store`, run here), the new version
   registered with its digest and started as the canary.
4. Run 2: the job again (a new job object); it gets the canary model; one
   more turn of the loop reports it.
5. The summary: per-bucket times vs NCCL's default, a plot, a report.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Protocol

import yaml

from dynamiccl.api.registry import ModelStatus
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import Mode
from dynamiccl.demo.job import Cluster, Incarnation, create
from dynamiccl.demo.learning_run import LocalLoop
from dynamiccl.demo.report import (
    DemoSummary,
    ModelInfo,
    RunInfo,
    bucket_rows,
    geomean,
    markdown,
    plot,
)
from dynamiccl.demo.run import RunConfig, RunResult, run
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.learning.learning_status import retrain_rows
from dynamiccl.operator.learning.loop import TUNING_RUNS
from dynamiccl.operator.webhook.mutate import SIDECAR
from dynamiccl.policy.runtime.model_file import DEFAULT_MODEL
from dynamiccl.testing.kubelet import Volumes, container
from dynamiccl.testing.workload import STEP, TimeTable, build_time_table, calls_per_step, describe

ROOT: Final = Path(__file__).resolve().parents[2]
EXAMPLES: Final = ROOT / "examples"
TOPOLOGY: Final = EXAMPLES / "topology-aws-p5-2node.yaml"
JOB: Final = EXAMPLES / "pytorchjob.yaml"
POLICIES: Final = EXAMPLES / "policies"
LEARNED_POLICY: Final = "ml-learned"
NAMESPACE_LABELS: Final = {"team": "ml"}  # the job's namespace: selected by ml-learned
IMAGE: Final = "ghcr.io/dynamiccl/dynamiccl:0.1.0"
STEPS_FULL: Final = 1500
STEPS_FAST: Final = 1400


class DemoError(RuntimeError):
    """The demo cannot run (the message says what is missing)."""


class Ui(Protocol):
    """Where the demo reports progress."""

    def step(self, message: str) -> None: ...

    def progress(self, label: str, done: int, total: int) -> None: ...


class QuietUi:
    """No output (tests)."""

    def step(self, message: str) -> None:
        pass

    def progress(self, label: str, done: int, total: int) -> None:
        pass


@dataclass(frozen=True)
class Options:
    """What the user can choose."""

    out: Path
    fast: bool = False
    model: Path | None = None  # default: the shipped model
    seed: int = 0
    steps: int | None = None


@dataclass
class _State:
    spec: TopologySpec
    times: TimeTable
    local: LocalLoop
    rng: random.Random
    runs: list[tuple[Incarnation, RunResult]] = field(default_factory=list)


def shipped_model() -> Path:
    """The model the policy package ships (DemoError if it has none)."""
    if not DEFAULT_MODEL.is_file():
        raise DemoError(f"{DEFAULT_MODEL}: the shipped model is missing (use --model FILE)")
    return DEFAULT_MODEL


def plugin_lib() -> Path:
    """This checkout's plugin build directory (DemoError if the .so is not built)."""
    from dynamiccl.sidecar.ctypes_abi import default_so  # noqa: PLC0415

    so = default_so()
    if not so.is_file():
        raise DemoError(f"{so}: the plugin is not built (run `make plugin`)")
    return so.parent


def load_policies() -> list[dict[str, Any]]:
    """The sample policies as API objects. The demo's one change: `ml-learned` starts from
    `default` alone and retrains as soon as a job reported, its canary serving every new
    job (a cluster waits for 10 000 rewards or the night, and canaries 10 %)."""
    docs = [yaml.safe_load(p.read_text()) for p in sorted(POLICIES.glob("*.yaml"))]
    for doc in docs:
        name = doc["metadata"]["name"]
        doc["metadata"].update(uid=f"{name}-uid", creationTimestamp="2026-01-01T00:00:00Z")
        if name == LEARNED_POLICY:
            doc["spec"]["model"] = {"version": "default"}
            doc["spec"]["retraining"] = {"minNewExperience": 1, "canaryPercent": 100}
    policies, errors = parse_policies(docs)
    if errors:
        raise DemoError("; ".join(errors))
    learned = next((p for p in policies if p.name == LEARNED_POLICY), None)
    if learned is None or learned.spec.mode is not Mode.LEARNED:
        raise DemoError(f"{POLICIES}: no learned policy {LEARNED_POLICY}")
    return docs


SidecarCommand = Callable[[Mapping[str, Any], Volumes, Path], tuple[list[str], dict[str, str]]]


def sidecar_command(shared: Path, fast: bool) -> SidecarCommand:
    """How a pod's sidecar container runs here: its own command, `dynamiccl sidecar`.

    The demo's additions to the container's command: the job's epoch record
    and proposer lease (on Kubernetes the TuningRun and a Lease, compare-and-swap
    by resourceVersion) are files in `shared` (`--coordination file:DIR`); no
    metrics port; JSON lines (the final one says what was sent); and, because
    the demo's runs last a minute instead of hours, the shortest epoch interval
    (a table can take effect every 64 calls) and a tuner that may propose a new
    table every few seconds.
    """
    interval = "3" if fast else "8"

    def command(
        pod: Mapping[str, Any], vols: Volumes, pdir: Path
    ) -> tuple[list[str], dict[str, str]]:
        cmd = [str(a) for a in container(pod, SIDECAR, init=True).get("command") or []]
        if cmd[:1] != ["dynamiccl"]:
            raise DemoError(f"the injected sidecar runs {cmd}, not `dynamiccl ...`")
        argv = [sys.executable, "-m", "dynamiccl.cli", *cmd[1:]]
        argv += ["--coordination", f"file:{shared}", "--metrics-port", "0", "--json"]
        argv += ["--min-proposal-interval", interval, "--epoch-interval", "64"]
        argv += ["--flush-interval", "1", "--send-grace", "30"]
        return argv, {}

    return command


def _run_once(st: _State, label: str, opts: Options, ui: Ui) -> None:
    steps = opts.steps or (STEPS_FAST if opts.fast else STEPS_FULL)
    ingest = st.local.ingest
    inc = create(
        yaml.safe_load(JOB.read_text()),
        Cluster.of(st.spec, "ml-team", NAMESPACE_LABELS),
        st.local.policies(),
        rng=st.rng,
        image=IMAGE,
        ingest_url=ingest.url,
        ingest_ca=ingest.ca_pem,
        compiler=st.local.compiler,
    )
    st.local.api.add(TUNING_RUNS, inc.tuning_run)
    ui.step(f"{label}: {inc.message}")
    table = inc.table()
    if "format" in table:  # the operator's placeholder: no compiled table
        ui.step(f"{label}: NCCL decides everywhere ({table.get('reason')})")
    root = opts.out / label.replace(" ", "-")
    shared = root / "job-record"
    shared.mkdir(parents=True, exist_ok=True)
    for pod in inc.pods:
        ingest.resolver.add_pod(pod)
    cfg = RunConfig(
        steps=steps,
        seed=opts.seed * 1000 + len(st.runs) + 1,
        time_table=opts.out / "times.json",
        image_lib=plugin_lib(),
        ops=[(o.collective.nccl_id, o.nbytes, o.repeat) for o in STEP],
        sidecar=sidecar_command(shared, opts.fast),
    )

    def token_for(pod: Mapping[str, Any]) -> str:
        meta = pod["metadata"]
        sa = str((pod.get("spec") or {}).get("serviceAccountName", "default"))
        return st.local.issuer.issue(meta["namespace"], sa, meta["name"], meta["uid"])

    result = run(inc, cfg, root, token_for, lambda d, t: ui.progress(label, d, t))
    st.runs.append((inc, result))


def _learn(st: _State, label: str, opts: Options, ui: Ui, *, retrain: bool) -> str:
    """The learning loop's turn after a run; what `kubectl get tuningrun -o yaml` shows then
    goes into the run's folder. Returns the rollout's last word."""
    for event in st.local.learn(retrain=retrain):
        ui.step(f"learning loop: {event}")
    inc = st.runs[-1][0]
    meta = inc.tuning_run["metadata"]
    obj = st.local.api.get(TUNING_RUNS, meta["name"], meta["namespace"])
    (opts.out / label.replace(" ", "-") / "tuningrun.yaml").write_text(
        yaml.safe_dump(obj, sort_keys=False)
    )
    speedup = ((obj.get("status") or {}).get("reward") or {}).get("speedup")
    if speedup:
        ui.step(f"{label}: TuningRun {meta['name']} speedup {speedup:.3f}")
    rollout = st.local.rollout
    return rollout.reason if rollout is not None else "no rollout"


def sidecar_reports(result: RunResult) -> list[dict[str, Any]]:
    """The final JSON line (`"event": "stopped"`) of each sidecar's log."""
    out = []
    for log in result.sidecar_logs:
        last: dict[str, Any] = {}
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("event") == "stopped":
                    last = doc
        out.append(last)
    return out


def _total(reports: list[dict[str, Any]], key: str) -> int:
    """A counter of the sidecars' final reports, summed over the run's sidecars."""
    return sum(int(r.get(key, 0)) for r in reports)


def run_demo(opts: Options, ui: Ui | None = None) -> DemoSummary:
    """The whole demo; writes the report files into `opts.out` and returns the summary."""
    ui = ui or QuietUi()
    t0 = time.monotonic()
    opts = replace(opts, out=opts.out.resolve())
    model = opts.model or shipped_model()
    if opts.out.exists():
        for name in ("store.sqlite", "store.sqlite-wal", "store.sqlite-shm", "times.json"):
            (opts.out / name).unlink(missing_ok=True)
        (opts.out / "retrain.log").unlink(missing_ok=True)
        for d in ("models", "ingest", "operator", "run-1", "run-2"):
            shutil.rmtree(opts.out / d, ignore_errors=True)
    opts.out.mkdir(parents=True, exist_ok=True)
    spec = TopologySpec.model_validate(yaml.safe_load(TOPOLOGY.read_text()))
    ui.step(
        f"simulated cluster: {spec.nodes} x {spec.gpus_per_node} {spec.gpu}, {spec.fabric.value}"
    )
    times = build_time_table(spec)
    times.write(opts.out / "times.json")
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "ml-team", "labels": NAMESPACE_LABELS}}  # fmt: skip
    train = {"eval_jobs": 8 if opts.fast else 24, "calls_per_job": 16, "seed": opts.seed,
             "offline": {"steps": 60 if opts.fast else 200}}  # fmt: skip
    local = LocalLoop(opts.out, load_policies(), train=train, model=model, namespaces=[namespace])
    try:
        st = _State(spec, times, local, random.Random(opts.seed))
        _run_once(st, "run 1", opts, ui)
        _learn(st, "run 1", opts, ui, retrain=True)
        rows = retrain_rows(local.registry.list()[-1])
        if rows is not None:
            ui.step(f"train --from-store used {rows.rows_used} of {rows.rows_read} rows")
        _run_once(st, "run 2", opts, ui)
        verdict = _learn(st, "run 2", opts, ui, retrain=False)
        summary = _summary(st, opts, verdict, time.monotonic() - t0)
    finally:
        local.close()
    plot(summary, Path(summary.plot))
    Path(summary.report).write_text(markdown(summary, describe(), {}))
    (opts.out / "summary.json").write_text(summary.model_dump_json(indent=2))
    return summary


def _summary(st: _State, opts: Options, canary: str, seconds: float) -> DemoSummary:
    store = st.local.ingest.store
    per_run = [store.experience_for_job(inc.uid, limit=10**7) for inc, _ in st.runs]
    rows = bucket_rows(STEP, st.times, per_run)
    runs = []
    sent_total = 0
    for inc, res in st.runs:
        reports = sidecar_reports(res)
        records = _total(reports, "acknowledged_records")
        sent_total += records
        runs.append(
            RunInfo(
                job_uid=inc.uid,
                model_version=inc.model_version,
                canary=inc.canary,
                calls_per_rank=max((r.calls for r in res.ranks), default=0),
                ranks=len(res.ranks),
                seconds=res.seconds,
                rewards_sent=records,
                reward_batches=_total(reports, "acknowledged_batches"),
                # agreed by every sidecar: the fewest any of them saw committed
                tables_committed=min(
                    (int(r.get("committed_epochs", 0)) for r in reports), default=0
                ),
            )
        )
    models = [
        ModelInfo(version=m.version, status=m.status.value, sha256=m.sha256, parent=m.parent)
        for m in st.local.registry.list()
    ]
    promoted = st.local.registry.current(ModelStatus.PROMOTED)
    return DemoSummary(
        speedup_geomean=geomean([r.speedup[1] if len(r.speedup) > 1 else None for r in rows]),
        speedup_geomean_run1=geomean([r.speedup[0] if r.speedup else None for r in rows]),
        rewards_sent=sent_total,
        rewards_ingested=store.count_experience(),
        model_versions=[m.version for m in models],
        models=models,
        buckets=rows,
        runs=runs,
        canary=f"{canary} (promoted: {promoted.version if promoted else '-'})",
        topology=st.spec.name,
        job=f"PyTorchJob {st.runs[0][0].job['metadata']['name']}",
        policy=LEARNED_POLICY,
        out_dir=str(opts.out),
        plot=str(opts.out / "demo.png"),
        report=str(opts.out / "report.md"),
        seconds=seconds,
        fast=opts.fast,
    )


def calls_per_run(opts: Options) -> int:
    """Collective calls each rank issues per run."""
    return (opts.steps or (STEPS_FAST if opts.fast else STEPS_FULL)) * calls_per_step()

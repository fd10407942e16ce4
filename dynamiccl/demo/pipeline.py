"""`dynamiccl demo`, step by step: the whole loop on a simulated cluster, no Kubernetes, no GPU.

1. The simulated cluster (`examples/topology-aws-p5-2node.yaml`), the sample
   NCCLTuningPolicies (`examples/policies/`), an experience store (SQLite) with
   the shipped model registered as `default`, the reward ingest over HTTPS.
2. Run 1: the annotated PyTorchJob (`examples/pytorchjob.yaml`) goes through
   the operator's decision and the admission webhook; its pods run: sidecars
   (`dynamiccl sidecar`) and 16 rank processes driving the real plugin `.so`,
   times from the simulator; rewards flow through the ingest into the store.
3. One retraining: the promoted model fine-tuned on the store's experience,
   registered with its digest, started as the canary.
4. Run 2: the job again (a new job object); it gets the canary model.
5. The summary: per-bucket times vs NCCL's default, a plot, a report.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import secrets
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
from dynamiccl.demo.auth import TokenIssuer
from dynamiccl.demo.ingest import IngestService
from dynamiccl.demo.job import Cluster, Incarnation, create
from dynamiccl.demo.kubelet import Volumes, container
from dynamiccl.demo.learn import Models
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
from dynamiccl.demo.workload import STEP, TimeTable, build_time_table, calls_per_step, describe
from dynamiccl.operator.controller.policy_match import Policy, parse_policies
from dynamiccl.operator.learning.reward_status import reward_status
from dynamiccl.operator.webhook.mutate import SIDECAR
from dynamiccl.policy.runtime.model_file import DEFAULT_MODEL

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
    ingest: IngestService
    models: Models
    issuer: TokenIssuer
    policies: list[Policy]
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


def load_policies() -> list[Policy]:
    """The sample policies; the learned one rolls out `default` only (no canary before training)."""
    docs = [yaml.safe_load(p.read_text()) for p in sorted(POLICIES.glob("*.yaml"))]
    for doc in docs:
        if doc["metadata"]["name"] == LEARNED_POLICY:
            doc["spec"]["model"] = {"version": "default"}
    policies, errors = parse_policies(docs)
    if errors:
        raise DemoError("; ".join(errors))
    return policies


def with_canary(policies: list[Policy], canary: str) -> list[Policy]:
    """The policies after the admin (or the loop) sends 100 % of new jobs to the canary."""
    out = []
    for p in policies:
        if p.name != LEARNED_POLICY:
            out.append(p)
            continue
        model = p.spec.model.model_copy(update={"canary_version": canary, "canary_percent": 100})
        out.append(Policy(p.name, p.spec.model_copy(update={"model": model}), p.generation + 1))
    return out


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


def _run_once(st: _State, policies: list[Policy], label: str, opts: Options, ui: Ui) -> None:
    steps = opts.steps or (STEPS_FAST if opts.fast else STEPS_FULL)
    inc = create(
        yaml.safe_load(JOB.read_text()),
        Cluster.of(st.spec, "ml-team", NAMESPACE_LABELS),
        policies,
        rng=st.rng,
        image=IMAGE,
        ingest_url=st.ingest.url,
        ingest_ca=st.ingest.ca_pem,
        compiler=st.models.compile,
    )
    ui.step(f"{label}: {inc.message}")
    table = inc.table()
    if "format" in table:  # the operator's placeholder: no compiled table
        ui.step(f"{label}: NCCL decides everywhere ({table.get('reason')})")
    root = opts.out / label.replace(" ", "-")
    shared = root / "job-record"
    shared.mkdir(parents=True, exist_ok=True)
    for pod in inc.pods:
        st.ingest.resolver.add_pod(pod)
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
        return st.issuer.issue(meta["namespace"], sa, meta["name"], meta["uid"])

    result = run(inc, cfg, root, token_for, lambda d, t: ui.progress(label, d, t))
    st.runs.append((inc, result))
    # What `kubectl get tuningrun -o yaml` would show once the loop synced the job's rewards.
    status = reward_status(st.ingest.store.job_summary(inc.uid)).patch()["status"]
    obj = {**inc.tuning_run, "status": {**(inc.tuning_run.get("status") or {}), **status}}
    (root / "tuningrun.yaml").write_text(yaml.safe_dump(obj, sort_keys=False))
    speedup = status["reward"].get("speedup")
    if speedup:
        ui.step(f"{label}: TuningRun {inc.tuning_run['metadata']['name']} speedup {speedup:.3f}")


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
        for d in ("models", "ingest", "run-1", "run-2"):
            shutil.rmtree(opts.out / d, ignore_errors=True)
    opts.out.mkdir(parents=True, exist_ok=True)
    spec = TopologySpec.model_validate(yaml.safe_load(TOPOLOGY.read_text()))
    ui.step(
        f"simulated cluster: {spec.nodes} x {spec.gpus_per_node} {spec.gpu}, {spec.fabric.value}"
    )
    times = build_time_table(spec)
    times.write(opts.out / "times.json")
    issuer = TokenIssuer(secrets.token_bytes(32))
    ingest = IngestService(opts.out / "ingest", opts.out / "store.sqlite", issuer)
    try:
        models = Models(ingest.store, ingest.store_url, opts.out / "models")
        models.bootstrap(model)
        policies = load_policies()
        learned = next(p for p in policies if p.name == LEARNED_POLICY)
        if learned.spec.mode is not Mode.LEARNED:  # pragma: no cover - the sample says learned
            raise DemoError(f"{LEARNED_POLICY} is not a learned policy")
        st = _State(spec, times, ingest, models, issuer, policies, random.Random(opts.seed))
        _run_once(st, policies, "run 1", opts, ui)
        ui.step("retraining on the experience store")
        mv, result = models.retrain(
            policy_name=LEARNED_POLICY, runs=[inc.tuning_run for inc, _ in st.runs],
            fast=opts.fast, seed=opts.seed,
        )  # fmt: skip
        m = result["metrics"]
        ui.step(
            f"train --from-store used {m['offline/used']:.0f} of {m['offline/records']:.0f} rows"
        )
        step = models.start_canary(100)
        ui.step(f"model {mv.version} registered (sha256 {mv.sha256[:12]}): {step.reason}")
        _run_once(st, with_canary(policies, mv.version), "run 2", opts, ui)
        models.record_features([inc.tuning_run for inc, _ in st.runs], dt.datetime.now(dt.UTC))
        verdict = models.start_canary(100)
        summary = _summary(st, opts, verdict.reason, time.monotonic() - t0)
    finally:
        ingest.close()
    plot(summary, Path(summary.plot))
    Path(summary.report).write_text(markdown(summary, describe(), {}))
    (opts.out / "summary.json").write_text(summary.model_dump_json(indent=2))
    return summary


def _summary(st: _State, opts: Options, canary: str, seconds: float) -> DemoSummary:
    store = st.ingest.store
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
        for m in st.models.versions()
    ]
    promoted = st.models.registry.current(ModelStatus.PROMOTED)
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

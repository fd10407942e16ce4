"""Jobs of one hardware class in a row on a departed surface, learning between them (issues 17, 21).

`LearningSequence.run_job()` plays one job and one turn of the learning loop
(dynamiccl/demo/learning_run.py says what is real and what stands in). The
cluster: 4 nodes of 8 H100 (InfiniBand, no NVLink SHARP) in two racks, one
32-rank data-parallel communicator per job; each training step
all-reduces two 32 MiB and one 128 MiB gradient bucket, all-gathers and
reduce-scatters 16 MiB and all-reduces 64 KiB of statistics. NCCL's own pick
for the large all-reduces is Ring; on this surface Tree is 1.25x faster there
(`surface.Departure`), which neither NCCL's cost model nor the shipped model knows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Collective
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.api.table import Choice, DecisionTable, scale_class, size_bucket
from dynamiccl.api.topology import TopologySpec
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.demo.harness_job import JobSpec, play_job
from dynamiccl.demo.learning_run import NS, LocalLoop, policy_object, table_of
from dynamiccl.demo.story import JobRow, from_tuning_run, new_findings
from dynamiccl.operator.controller import configmap, tuningrun
from dynamiccl.operator.controller.policy_match import choose_model, parent_model
from dynamiccl.operator.learning.loop import POLICIES, TUNING_RUNS
from dynamiccl.policy.online.knob_experiment import cohort_of
from dynamiccl.sidecar.sender import Client
from dynamiccl.testing.surface import Departure, Surface
from dynamiccl.testing.workload import Op, build_time_table

POLICY: Final = "cluster-learned"
DEPARTURE: Final = Departure()
STEP: Final = (
    (Collective.ALLREDUCE, 32 << 20),
    (Collective.ALLREDUCE, 32 << 20),
    (Collective.ALLREDUCE, 128 << 20),
    (Collective.ALLGATHER, 16 << 20),
    (Collective.REDUCESCATTER, 16 << 20),
    (Collective.ALLREDUCE, 64 << 10),
)
NODE: Final = {
    "name": "h100-ib-2racks", "gpu": "H100", "gpus_per_node": 8, "nodes": 4,
    "intra": "nvswitch", "nvlink_GBps": 450, "nvls": False, "pcie_gen": 5,
    "nics_per_node": 8, "nic_Gbps": 400, "fabric": "infiniband", "sharp": False,
}  # fmt: skip
# 4 nodes x 8 ranks in two racks: 112 same-node, 128 same-rack, 256 cross-rack rank pairs of 496
TIERS: Final = {"same_node": 112 / 496, "same_rack": 128 / 496, "cross_rack": 256 / 496}


@dataclass(frozen=True)
class SequenceConfig:
    """One sequence of jobs."""

    calls: int = 100_000  # per job
    departure: Departure | None = DEPARTURE
    budget_percent: float = 1.0
    canary_percent: int = 50
    seed: int = 0
    eval_jobs: int = 4  # the retrain's held-out evaluation (the cluster's default is 200)
    step: tuple[tuple[Collective, int], ...] = STEP  # the calls of one training step
    confirm_jobs: int = 2  # exploration.confirmJobs (100: no finding holds, only models)


def features() -> StateFeatures:
    mix = dict(TIERS)
    mix["cross_rack"] = 1.0 - mix["same_node"] - mix["same_rack"]
    return StateFeatures.model_validate(
        {
            "world_size": 32, "gpus_per_pod": 8, "replicas": 4, "nproc_per_node": 8,
            "scheduled": True,
            "topology": {**NODE, "tier_max": "cross_rack", "tier_mix": mix},
        }
    )  # fmt: skip


def policy_spec(cfg: SequenceConfig) -> NCCLTuningPolicySpec:
    return NCCLTuningPolicySpec.model_validate(
        {
            "mode": "learned",
            "exploration": {"budgetPercent": cfg.budget_percent, "confirmJobs": cfg.confirm_jobs},
            "retraining": {"minNewExperience": 1, "canaryPercent": cfg.canary_percent},
        }
    )


def _ref(uid: str) -> configmap.JobRef:
    return configmap.JobRef("kubeflow.org/v1", "PyTorchJob", f"job-{uid}", NS, uid)


class LearningSequence:
    """The harness-played cluster (see the module docstring)."""

    def __init__(self, work: Path, cfg: SequenceConfig) -> None:
        self.work, self.cfg = work, cfg
        work.mkdir(parents=True, exist_ok=True)
        self.features = features()
        self.hw_class = cohort_of(self.features)[0]
        ops = tuple(Op(c, n, 1, "") for c, n in dict.fromkeys(cfg.step))
        times = build_time_table(TopologySpec.model_validate(NODE), ops)
        self.surface = Surface(times, cfg.departure, cfg.seed)
        self.spec = policy_spec(cfg)
        self.local = LocalLoop(
            work, [policy_object(POLICY, self.spec)],
            train={"eval_jobs": cfg.eval_jobs, "seed": cfg.seed},
        )  # fmt: skip
        self.ingest, self.api = self.local.ingest, self.local.api
        self.registry = self.local.registry
        self.rows: list[JobRow] = []
        self._rng = random.Random(cfg.seed)  # job uids: which jobs get the canary
        self.compiler = self.local.compiler
        self.held: set[tuple[Any, ...]] = set()  # the class's findings seen holding so far

    def close(self) -> None:
        self.local.close()

    def model_table(self, version: str) -> DecisionTable:
        """The version's own compiled table (no exploration assignment, no findings)."""
        return DecisionTable.model_validate(
            self.compiler(self.features, self.spec, version).model_dump(mode="json")
        )

    def decide(
        self, uid: str, version: str | None = None
    ) -> tuple[str, bool, DecisionTable, configmap.Compiled, dict[str, Any]]:
        """The operator's decision for job `uid`, written nowhere (`reconcile._tuned`'s calls):
        the model version (`version`: that one), canary or not, the job's compiled table (and
        its record) and its ConfigMap."""
        (policy,) = self.local.policies()
        version, canary = (
            (version, False) if version else choose_model(policy.spec.model, uid, policy.learning)
        )
        coverage = policy.learning.coverage(self.hw_class) if policy.learning else None
        kept = configmap.compile_job(
            self.features, policy.spec, version, self.compiler, coverage=coverage, job_uid=uid,
            baseline_version=parent_model(policy.spec.model, policy.learning) if canary else None,
        )  # fmt: skip
        cm = configmap.build(
            _ref(uid), self.features, POLICY, policy.spec, model_version=version, canary=canary,
            kept=kept,
        )  # fmt: skip
        table = table_of(cm)
        if table is None:
            raise RuntimeError(f"no table for job {uid}: {cm['data'][configmap.KEY_TABLE]}")
        return version, canary, table, kept, cm

    def _config_map(self, uid: str) -> tuple[str, DecisionTable, dict[str, str]]:
        """The decision for a new job, its TuningRun written (`tuningrun.build`); the model
        version, the table and the ConfigMap's data (what its sidecar reads)."""
        version, canary, table, kept, cm = self.decide(uid)
        decision = tuningrun.Decision(
            _ref(uid), tuned=True, reason="Tuned", message="", mode=self.spec.mode,
            policy_name=POLICY, model_version=version, canary=canary, features=self.features,
            table_digest=configmap.digest(kept.table), measured_cells=kept.measured,
            arms_baseline=kept.arms_baseline, arms=kept.arms,
        )  # fmt: skip
        self.api.add(TUNING_RUNS, tuningrun.build(decision))
        return version, table, cm["data"]

    def _first_choices(
        self, table: DecisionTable, *, departed: bool
    ) -> list[tuple[int, Collective, Choice | None]]:
        """(collective id, the cell's first choice or None) for the step's calls (only the
        departed ones with `departed`)."""
        d = self.cfg.departure
        sc = scale_class(self.features.world_size, self.features.topology.nodes)
        out: list[tuple[int, Collective, Choice | None]] = []
        for c, n in dict.fromkeys(self.cfg.step):
            if departed and (d is None or not d.applies(c.nccl_id, n)):
                continue
            cell = table.cell(c, size_bucket(n), sc)
            out.append((n, c, cell.choices[0] if cell is not None and cell.choices else None))
        return out

    def runs_departure(self, table: DecisionTable) -> bool:
        """Does the table run what is faster in every departed cell of the job: the departed
        algorithm, or (NCCL's pair slow) another pair than NCCL's?"""
        d = self.cfg.departure or Departure()
        chosen = self._first_choices(table, departed=True)
        if d.slow_pick:
            return bool(chosen) and all(
                ch is not None
                and (ch.algo.nccl_id, ch.proto.nccl_id) != self.surface.nccl_pair(c.nccl_id, n)
                for n, c, ch in chosen
            )
        return bool(chosen) and all(ch is not None and ch.algo is d.faster for _, _, ch in chosen)

    def leaves_nccl(self, table: DecisionTable) -> bool:
        """Does the table leave NCCL's own pair in any cell of the step?"""
        return any(
            ch is not None
            and (ch.algo.nccl_id, ch.proto.nccl_id) != self.surface.nccl_pair(c.nccl_id, n)
            for n, c, ch in self._first_choices(table, departed=False)
        )

    def _admit(self, uid: str, version: str) -> tuple[JobSpec, Client]:
        """The job's pod, and a client holding its pod's own valid token."""
        job = JobSpec(
            namespace=NS, name=f"job-{uid}", uid=uid, pod_name=f"job-{uid}-worker-0",
            pod_uid=f"pod-{uid}", model_version=version, features=self.features,
            step=[(c.nccl_id, n) for c, n in self.cfg.step], calls=self.cfg.calls,
        )  # fmt: skip
        self.ingest.resolver.add_pod(_pod(job))
        token = self.work / "token"
        token.write_text(self.local.issuer.issue(NS, "default", job.pod_name, job.pod_uid))
        return job, Client(self.ingest.url, token, self.work / "ca.crt")

    def post_as_job(self, records: list[dict[str, Any]]) -> int:
        """A tuned job whose own pod posts `records` (made up: a compromised sidecar) instead of
        what it ran, then one turn of the learning loop; the ingest's answer (issue 29)."""
        uid = f"{len(self.rows) + 1:04d}-x{self._rng.getrandbits(32):08x}"
        version, _, _ = self._config_map(uid)
        job, client = self._admit(uid, version)
        batch = {
            "idempotency_key": f"{job.pod_uid}/1", "model_version": version, "table_version": 1,
            "job": {"namespace": NS, "kind": "PyTorchJob", "name": job.name, "uid": uid},
            "pod": {"name": job.pod_name, "uid": job.pod_uid}, "records": records,
        }  # fmt: skip
        status = client.post(RewardBatch.model_validate(batch).model_dump_json().encode()).status
        client.close()
        self._learn([])
        return status

    def run_job(self) -> JobRow:
        """One job, then one turn of the learning loop (retraining included when it is due)."""
        i = len(self.rows) + 1
        uid = f"{i:04d}-{self._rng.getrandbits(32):08x}"
        version, table, config = self._config_map(uid)
        job, client = self._admit(uid, version)
        try:
            played = play_job(job, config, self.surface, self.work / "jobs" / uid, client)
        finally:
            client.close()
        events: list[str] = []
        self._learn(events)
        row = from_tuning_run(
            i, job.name, self.api.get(TUNING_RUNS, configmap.object_name(job.name), NS)
        )
        row.played, row.table, row.events = played, table, events
        row.runs_departure, row.leaves_nccl = self.runs_departure(table), self.leaves_nccl(table)
        # the job's speedup as the store's job outcomes give it (what the canary judge reads)
        mine = [o for o in self.ingest.store.job_outcomes([version]) if o.job_uid == uid]
        row.speedup = mine[0].speedup if mine else None
        self.rows.append(row)
        return row

    def learning(self) -> dict[str, Any]:
        return dict(self.api.get(POLICIES, POLICY).get("status", {}).get("learning") or {})

    def _learn(self, events: list[str]) -> None:
        """One turn of the learning loop (and the retraining it launches); what it did."""
        events += self.local.learn()
        events += new_findings(self.learning(), self.held)


def _pod(job: JobSpec) -> dict[str, Any]:
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job.name,
             "uid": job.uid, "controller": True}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": job.pod_name, "namespace": job.namespace, "uid": job.pod_uid,
                     "ownerReferences": [owner]},
        "spec": {"serviceAccountName": "default"},
    }  # fmt: skip

"""The learning loop on real containers: a retrain on the real node changes what the next job runs.

On the chart's release (tests/real/conftest.py `release`: operator, ingest and
store on the real node), a learned policy with a 100 % canary share:

1. a PyTorchJob of 4 pods x 8 A100 through the real training operator gets
   its TuningRun and table from the operator (the shipped model);
2. its rewards reach the ingest as a sidecar sends them: the sidecar's own HTTPS
   client with a pod-bound ServiceAccount token, through the ingest Service
   (ClusterIP, kube-proxy's rules on this machine, certificate verified for the
   Service's DNS name). They come from the job's calls played through the real
   plugin `.so` on the simulator's surface for the job's own topology, where
   Tree runs 1.25x faster than Ring for all-reduce >= 32 MiB, which neither
   NCCL's cost model nor the shipped model knows. Up to 6 such jobs run, until
   two of them each measured the same configuration faster than NCCL's pick in
   the same cell (a retrain weighs one job's claimed gain as nothing, issue 29;
   two jobs that each committed the faster pair at another channel count, as an
   early escape may, confirm neither);
3. the policy's retraining trigger (minNewExperience, set once the rewards are
   in) makes the ingest's learning loop create the retraining Job; its pod runs
   the trainer image to completion on the real node, the loop registers the
   model and starts its canary;
4. the next job's TuningRun names the new version as its canary model, and its
   table is the one compiled from the new model (so the operator fetched it);
5. the effect: compiled for that job, the new model's table differs from its
   parent's in every cell where the rewards showed NCCL's pick slower (and runs
   the faster configuration the rewards measured there), and keeps the parent's
   choice in every cell where the rewards showed NCCL's pick the fastest.

Stand-ins: the jobs' pods run on kwok nodes (the A100 nodes of the local
cluster; no container starts there), and the jobs' calls are played on this
machine by `dynamiccl.demo.harness_job.play_job` (the real plugin `.so`, the
sidecar's attribution, aggregation, baseline and exploration budget; times from
the simulator with a departure instead of GPUs), posting from here instead of
from a pod. The retraining Job, the ingest, the store, the loop, the operator and
the webhook are the real ones in real containers.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.operator.learning.retrain import MODEL_VERSION_LABEL
from dynamiccl.policy.runtime.model_file import DEFAULT_NPZ
from dynamiccl.policy.train.store_data import Weighting
from dynamiccl.testing.real_manifests import NODE_NAME
from dynamiccl.testing.real_node_sessions import SESSION_LABELS
from dynamiccl.testing.real_release import read_env
from tests.real.conftest import (
    HACK_DIR,
    RELEASE,
    RealCluster,
    Release,
    _cache_dir,
    diagnose,
    wait_until,
)
from tests.real.learning_jobs import (
    CALLS,
    NS_LABEL,
    NTP,
    POLICY,
    canary,
    compile_for,
    finish,
    finished_pod,
    ingest_log,
    other_ingests,
    play,
    policy_body,
    retrain_job,
    tuned_job,
)
from tests.real.learning_support import (
    confirmed_slower_cells,
    finding_choices,
    first_choices,
    measured_cells,
    nccl_fastest_cells,
    nccl_picks,
    slower_cells,
)

pytestmark = [pytest.mark.real]

PARENT_JOBS: Final = 6  # at most, before the retrain
RETRAIN_TIMEOUT_S: Final = 900
# the retraining Job on a 2-core node next to the chart's pods; a 5 s loop for the test
LEARNING: Final = {"learning.cpu": "1", "learning.memory": "2Gi", "learning.interval": "5"}


@dataclass
class Timings:
    """What the test measured (printed at the end; docs/development.md quotes them)."""

    values: dict[str, float]

    def mark(self, what: str, seconds: float) -> None:
        self.values[what] = round(seconds, 1)


@pytest.fixture
def learning_release(real_cluster: RealCluster, release: Release) -> Iterator[Release]:
    """The session's release with the trainer image imported and a retraining Job that fits."""
    up = subprocess.run(
        ["bash", str(HACK_DIR / "real-node.sh"), "up", "--no-build", "--with-trainer"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert up.returncode == 0, f"real-node.sh up --with-trainer:\n{up.stderr[-3000:]}"
    for line in up.stderr.splitlines():
        if "image" in line and "-train" in line:
            print(line)  # "import <ref> in N s" or "ok image <ref> (in containerd)"
    # the release's own values file with the learning values on top
    values = release.values_file()
    sets = [a for k, v in LEARNING.items() for a in ("--set", f"{k}={v}")]
    real_cluster.helm_run(
        "upgrade", RELEASE, "charts/dynamiccl", "-n", release.namespace, "-f", str(values), *sets
    )
    apps: Any = real_cluster.apps()

    def ingest_rolled() -> bool:
        d = apps.read_namespaced_deployment(release.ingest(), release.namespace)
        s = d.status
        return bool(
            s.observed_generation == d.metadata.generation
            and (s.updated_replicas or 0) == (s.available_replicas or 0) == 1
            and not s.unavailable_replicas
        )

    wait_until("the ingest with the learning values", ingest_rolled, 300)
    try:
        yield release
    finally:
        with contextlib.suppress(AssertionError):
            real_cluster.helm_run("rollback", RELEASE, "-n", release.namespace, "--wait")


def test_a_retrain_on_the_real_node_changes_the_next_jobs_table_where_nccl_was_slower(
    real_cluster: RealCluster, learning_release: Release, tmp_path: Path
) -> None:
    rel = learning_release
    core: Any = real_cluster.core()
    custom: Any = real_cluster.custom()
    timings = Timings({})
    ns = f"dcl-learn-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns, "labels": {NS_LABEL: ns, **SESSION_LABELS}}})
    # no retraining by count until job 1's rewards are in (the store may hold other rows)
    custom.create_cluster_custom_object(*NTP[:2], NTP[2], policy_body(ns, 0))
    try:
        # jobs on the parent model until their exploration measured NCCL's pick slower
        # somewhere (exploration is randomised per job; the first job usually does)
        batches: list[RewardBatch] = []
        per_job: list[list[RewardBatch]] = []
        for i in range(1, PARENT_JOBS + 1):
            t0 = time.monotonic()
            job1 = tuned_job(real_cluster, ns, f"learn-{i}")
            timings.mark(f"job {i} created -> table for its pods (s)", time.monotonic() - t0)
            t0 = time.monotonic()
            per_job.append(play(real_cluster, rel, ns, job1, tmp_path / f"job{i}").batches)
            batches += per_job[-1]
            timings.mark(f"job {i}: {CALLS} calls played and posted (s)", time.monotonic() - t0)
            finish(real_cluster, ns, job1)
            if confirmed_slower_cells(per_job, Weighting().min_jobs):
                break
        parent_version = job1.run["spec"]["modelVersion"]
        # what the retrain learns from: a departure that min_jobs jobs each measured (one job's
        # claimed gain weighs nothing, issue 29)
        slow = confirmed_slower_cells(per_job, Weighting().min_jobs)
        measured = measured_cells(batches)
        assert slow, (
            f"{i} jobs' rewards show no cell where {Weighting().min_jobs} of them measured "
            f"NCCL's pick slower: one job's {[sorted(slower_cells(b)) for b in per_job]}; "
            f"measured {sorted(measured)}"
        )

        # the trigger: retraining due at the next pass of the loop
        t0 = time.monotonic()
        custom.patch_cluster_custom_object(
            *NTP[:2], NTP[2], POLICY, {"spec": {"retraining": {"minNewExperience": 1}}}
        )
        try:
            wait_until(
                "the retraining Job to finish",
                lambda: bool(retrain_job(real_cluster, rel)),
                RETRAIN_TIMEOUT_S,
                2.0,
            )
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}\n{diagnose(real_cluster, rel.namespace)}")
        job = retrain_job(real_cluster, rel)
        assert job is not None
        timings.mark("trigger -> retraining Job finished (s)", time.monotonic() - t0)
        version = job["metadata"]["labels"][MODEL_VERSION_LABEL]
        pod = finished_pod(real_cluster, rel, job["metadata"]["name"])
        assert job["status"].get("succeeded"), diagnose(real_cluster, rel.namespace)
        # on the real node, the trainer image, run to completion
        assert pod.spec.node_name == NODE_NAME
        images = read_env(_cache_dir() / "images" / "images.env")
        assert pod.spec.containers[0].image == images["DYNAMICCL_IMAGE_TRAIN"]
        (status,) = pod.status.container_statuses
        term = status.state.terminated
        assert term is not None
        assert term.exit_code == 0
        timings.mark(
            "retraining pod: container start -> exit (s)",
            (term.finished_at - term.started_at).total_seconds(),
        )
        parent = job["metadata"]["annotations"][f"{c.GROUP}/parent-model-version"]
        assert parent == parent_version  # fine-tunes the version job 1 ran

        # registered, its canary started: the policy's status names it
        t0 = time.monotonic()
        wait_until(
            f"the canary {version} in the policy's status",
            lambda: canary(real_cluster) == version,
            120,
        )
        timings.mark("Job finished -> canary in status.learning (s)", time.monotonic() - t0)

        # job 2: the operator assigns the canary and compiles its table from the fetched model
        t0 = time.monotonic()
        job2 = tuned_job(real_cluster, ns, "learn-next")
        timings.mark("next job created -> table for its scheduled pods (s)", time.monotonic() - t0)
        policy = custom.get_cluster_custom_object(*NTP[:2], NTP[2], POLICY)
        rollout = ((policy.get("status") or {}).get("learning") or {}).get("rollout")
        assert job2.run["spec"]["modelVersion"] == version, (
            f"policy rollout {rollout}; other releases' ingests (their learning loops also "
            f"write the primary policy's status): {other_ingests(real_cluster, rel)}\n"
            f"{diagnose(real_cluster, rel.namespace)}"
        )
        assert job2.run["spec"]["canary"] is True

        spec = NCCLTuningPolicySpec.model_validate(policy_body(ns, 1)["spec"])
        models = rel.volume / "models"
        parent_npz = DEFAULT_NPZ if parent == "default" else models / parent / "model.npz"
        before = first_choices(compile_for(parent_npz, job2.features, spec))
        after = first_choices(compile_for(models / version / "model.npz", job2.features, spec))
        # job 2's table is the new model's (the operator fetched and compiled it), except in
        # the cells where the class's findings start every job (measured beats modelled:
        # its TuningRun's measuredCells), which run the finding's configuration
        found = finding_choices(job2.run)
        ran = first_choices(job2.table)
        assert {k: v for k, v in ran.items() if k not in found} == {
            k: v for k, v in after.items() if k not in found
        }
        missed = {k: (ran.get(k), v) for k, v in found.items() if ran.get(k) != v}
        assert not missed, (missed, job2.run["spec"].get("measuredCells"))
        # job 1's was the parent's
        assert first_choices(job1.table) == first_choices(
            compile_for(parent_npz, job1.features, spec)
        )

        # evidence kept with the test's files: the model's manifest and metrics, the store
        evidence = tmp_path / "evidence"
        shutil.copytree(models / version, evidence / version)
        with sqlite3.connect(rel.store_db()) as src, sqlite3.connect(evidence / "store.db") as dst:
            src.backup(dst)  # through the WAL, unlike a file copy
        (evidence / "rewards.jsonl").write_text(
            "".join(b.model_dump_json() + "\n" for b in batches)
        )
        (evidence / "features.json").write_text(job2.features.model_dump_json(indent=1))
        metrics = json.loads((models / version / "metrics.json").read_text()).get("metrics", {})
        offline = {k: v for k, v in metrics.items() if k.startswith("offline/")}
        (evidence / "ingest.log").write_text(ingest_log(real_cluster, rel))

        # the effect: different exactly where the rewards showed NCCL's pick slower
        for cell, (algo, proto, speedup) in slow.items():
            assert before.get(cell) != (algo, proto), (cell, "the parent already ran it")
            assert after.get(cell) == (algo, proto), (
                f"{cell}: the rewards measured {algo.value}/{proto.value} {speedup:.3f}x faster "
                f"than NCCL's pick; the retrained table runs {after.get(cell)} (parent: "
                f"{before.get(cell)}); retrain {offline}; evidence in {evidence}"
            )
        # ... and the same wherever the job's exploration showed NCCL's pick the fastest
        # (cells where an alternative was only slightly faster, or where nothing but NCCL's
        # pick ran, may go either way)
        # (a cell without choices runs NCCL's pick: a first choice naming it decides the same)
        fastest, nccl = nccl_fastest_cells(batches), nccl_picks(batches)
        for cell, best in fastest.items():
            pick = nccl.get(cell)
            runs_after, runs_before = after.get(cell, pick), before.get(cell, pick)
            assert runs_after == runs_before, (
                f"{cell}: nothing measured beat NCCL's pick {pick} (best {best:.3f}x), "
                f"yet the retrained table runs {runs_after} instead of the parent's "
                f"{runs_before}; evidence in {evidence}"
            )
        unmeasured = {k for k in set(before) | set(after) if k not in measured}
        changed_elsewhere = sorted(
            (k[0].value, k[1], k[2]) for k in unmeasured if before.get(k) != after.get(k)
        )
        print(
            json.dumps(
                {
                    "learning_real": timings.values,
                    "slower_cells": {
                        f"{k[0].value}/{k[1]}/{k[2]}": [a.value, p.value, round(s, 3)]
                        for k, (a, p, s) in slow.items()
                    },
                    "measured_cells": len(measured),
                    "nccl_fastest_cells": len(fastest),
                    "unmeasured_cells_changed": changed_elsewhere,
                    "model": version,
                    "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                }
            )
        )
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(*NTP[:2], NTP[2], POLICY)
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)

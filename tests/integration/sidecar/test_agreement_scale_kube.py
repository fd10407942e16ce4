"""Issue 33 item 2 on a REAL kube-apiserver: a job of 2 000 pods agrees on an epoch.

Every pod's sidecar part is the product's `Participant` (its ballot in one of the job's 63
ballot ConfigMaps) and the proposer the product's `Coordinator`, driven by
benchmarks/agreement_scale_bench.py (`run_epoch`); the one stand-in is each pod's
shared-memory file with its process (`PodFile`). Cluster: ``cluster_kubeconfig`` of
tests/integration/conftest.py; each epoch runs in a namespace of its own, deleted after.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dynamiccl.kubeclient import api_client

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "agreement_scale_bench.py"
PODS = 2000


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agreement_scale_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(900)
def test_two_thousand_pods_commit_an_epoch_without_one_conflicting_write(
    cluster_kubeconfig: Path,
) -> None:
    row = bench().run_epoch(api_client(cluster_kubeconfig), PODS, "now", timeout_s=600)
    assert row["status"] == "committed", row
    assert row["all_files_committed_s"] is not None, row  # every pod's file says COMMITTED
    assert row["votes_in"] == PODS
    assert row["rounds"] <= 3, row  # vote, decide, mirror: no retries
    assert row["conflicts_409"] == 0, row
    # each pod's vote (its own key), the proposal, the outcome, the table: O(1) per object
    assert row["writes"] <= PODS + 8, row
    assert row["step_failures"] == {}, row


@pytest.mark.timeout(900)
def test_one_pod_missing_its_process_aborts_the_epoch_for_every_pod(
    cluster_kubeconfig: Path,
) -> None:
    row = bench().run_epoch(
        api_client(cluster_kubeconfig), PODS, "now", timeout_s=600, missing=PODS - 1
    )
    assert row["status"] == "aborted", row
    assert row["all_files_committed_s"] is None, row  # no pod's file took the table
    assert row["step_failures"] == {}, row

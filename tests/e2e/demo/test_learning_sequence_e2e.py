"""Issue 21's story on the real control plane: jobs find a departure, the cluster adopts it.

What `make demo-cluster` runs, shorter: helm install of the chart; the chart's
operator and ingest (with its learning loop) as local processes with the chart's
arguments; a real PostgreSQL store (hack/pg_server.py; SQLite when its binaries
are missing); PyTorchJobs of one hardware class (4 x 8 A100) in a row through the
real apiserver, training operator, webhook and scheduler; each job's calls through
the real plugin .so and the sidecar's pieces, rewards over HTTPS with pod-bound
TokenRequest tokens; the real Job controller around the retraining Job.

Stand-ins (dynamiccl/demo/kube_sequence.py): the pods' containers (one rank plays
the communicator, times from the simulator with the departure) and the retraining
Job's pod (its container's command run here; kwok runs no containers).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.demo import kube_driver
from dynamiccl.demo.kube_manifests import POLICY, RELEASE, SYSTEM_NS, learning_policy
from dynamiccl.demo.kube_sequence import (
    ClusterSequence,
    SequenceSettings,
    learning_of,
    other_loops,
    outranked_by,
)
from dynamiccl.demo.story import HEADER, JobRow, format_row, outcome
from dynamiccl.testing.kubectl import Cluster
from dynamiccl.testing.real_node_sessions import real_tier_lock, remove_leftovers
from dynamiccl.testing.surface import Departure
from tests.chart_releases import drop_other_releases_policies

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]
CALLS = 30_000  # per job where NCCL is right (nothing to find: short jobs suffice)
# per job with the departure: the size issue 21's target is measured at (learning_sequence_bench,
# `make demo-cluster`). At 30 000 calls a job explores a departed cell's candidates too few times
# for a verdict (the 128 MiB cell: one call in six, 4-15 exploratory calls a job, MIN_CALLS 16),
# so adoption came as late as job 7 (fc9) or not within 10 jobs (2026-11-29, fc19)
DEPARTURE_CALLS = 100_000


@pytest.fixture
def services(cluster: Any, tmp_path: Path) -> Iterator[tuple[Cluster, int, Path]]:
    bin_dir = Path(cluster.kubeconfig).parent / "bin"
    if not (bin_dir / "helm").exists():
        pytest.skip("needs the pinned helm/kubectl of a hack/cluster-up.sh cluster")
    cl = Cluster(str(cluster.kubeconfig), bin_dir)
    # a real-node session a killed run left runs its own learning loop in this cluster (seen
    # in CI): under the real node's lock what it left goes, and no real-tier session starts
    cluster_dir = Path(cluster.kubeconfig).parent
    with real_tier_lock(cluster_dir, print):
        remove_leftovers(cl, cluster_dir / "node", print)
        yield from _services(cl, cluster, tmp_path)


def _services(cl: Cluster, cluster: Any, tmp_path: Path) -> Iterator[tuple[Cluster, int, Path]]:
    kube_driver.fresh_start(cl, tmp_path)
    drop_other_releases_policies(cluster.api, RELEASE)
    pg = kube_driver.start_store("postgres", tmp_path)  # None: no server binaries, SQLite
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs, port = kube_driver.start_services(cl, tmp_path, pg.url if pg is not None else "")
        kube_driver.ensure_namespace(cl)
        yield cl, port, tmp_path
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        if pg is not None:
            pg.stop()
        # the demo's learned policy outranks others: left behind, every other release's
        # learning loop in the cluster would follow it
        cl.sh(
            cl.kubectl, "--kubeconfig", cl.kubeconfig, "delete", "ntp", POLICY, "--ignore-not-found"
        )
        # the chart's admission policies are cluster-wide and exempt only this release's
        # operator: left installed, the release refuses the next tier's operator
        cl.sh(
            cl.helm, "--kubeconfig", cl.kubeconfig, "-n", SYSTEM_NS,
            "uninstall", RELEASE, "--wait", "--timeout", "120s",
        )  # fmt: skip


def _sequence(
    services: tuple[Cluster, int, Path], departure: Departure | None, calls: int
) -> ClusterSequence:
    cl, port, out = services
    cl.apply(learning_policy(canary_percent=100, budget_percent=1.0))
    other = outranked_by(cl)
    if other:  # a shared cluster: another release's tests own the learning loop's lineage now
        pytest.skip(f"learned policy {other} outranks the demo's; the loop would follow it")
    loops = other_loops(cl)
    if loops:  # they would write the policy's status.learning from their own registry
        pytest.skip(f"other releases' learning loops run in this cluster: {loops}")
    s = SequenceSettings(calls=calls, departure=departure, wait_for_retrain=True)
    print(HEADER)
    return ClusterSequence(cl, out, port, s, print)


def _job(seq: ClusterSequence) -> JobRow:
    """One more job; its line as `make demo-cluster` prints it (pytest -s shows the curve)."""
    t = time.monotonic()
    row = seq.run_job()
    row.seconds = time.monotonic() - t
    print(format_row(row), flush=True)
    return row


def test_a_departure_found_by_exploration_is_adopted_by_the_retrained_model(
    services: tuple[Cluster, int, Path],
) -> None:
    seq = _sequence(services, Departure(), DEPARTURE_CALLS)
    # issue 21's target: found and adopted within 10 jobs (a finding needs a second job's
    # confirmation): run until two jobs ran it, at most 10.
    for _ in range(10):
        row = _job(seq)
        # the hard budget, for every job
        assert row.cost_percent <= 1.0, row
        if sum(r.runs_departure for r in seq.results) >= 2:
            break
    rows = seq.results
    res = outcome(rows, learning_of(seq.cl), lambda f: f["algo"] == "tree")
    # the first jobs' exploration found Tree (the budget opens after about a thousand calls,
    # so the first job may not reach a departed cell's candidate yet)
    assert res.found_at is not None, [r.found for r in rows]
    assert res.found_at <= 3, [r.found for r in rows]
    assert rows[0].explored_calls > 0
    adopters = [r for r in rows if r.runs_departure]
    assert adopters, "no table runs Tree in the departed cells"
    # measured beats modelled (issue 29): once two jobs measured Tree faster, every job runs it
    # (its finding in the operator's table), whatever model version it got
    first = rows.index(adopters[0])
    assert all(r.runs_departure for r in rows[first:]), [r.runs_departure for r in rows]
    others = [r.speedup or 0.0 for r in rows[:first]]
    assert min(r.speedup or 0.0 for r in adopters) > max(others) + 0.04, rows
    # a retrained canary need not be promoted for Tree any more: every job runs the finding
    (hc,) = res.learning["hardwareClasses"]
    assert any(f["algo"] == "tree" and f["holds"] for f in hc.get("findings") or []), hc
    assert any(d["algo"] == "tree" and d["adopted"] for d in hc["departures"]), hc["departures"]


def test_where_nccl_is_right_the_model_stays_on_nccls_pick(
    services: tuple[Cluster, int, Path],
) -> None:
    seq = _sequence(services, None, CALLS)
    hc: dict[str, Any] = {}
    for _ in range(8):  # until the measurements settle every cell the jobs ran
        row = _job(seq)
        assert row.cost_percent <= 1.0, row
        assert not row.runs_departure, row
        assert not any(f["algo"] == "tree" for f in row.found), row
        classes = learning_of(seq.cl).get("hardwareClasses") or []
        hc = classes[0] if classes else {}
        if len(seq.results) >= 3 and hc and hc["cellsSettled"] == hc["cellsMeasured"]:
            break
    assert any(r.model_version != "default" for r in seq.results)  # retrained models ran
    assert hc["departures"] == []
    # every cell settled on NCCL's pick
    assert hc["cellsSettled"] == hc["cellsMeasured"] > 0, _unsettled(hc)


def _unsettled(hc: dict[str, Any]) -> str:
    """The cells not settled, with what was measured in each (the assertion's message)."""
    lines = [f"{hc['cellsSettled']} of {hc['cellsMeasured']} cells settled; not settled:"]
    for c in hc["cells"]:
        if c.get("settled"):
            continue
        lines.append(f"  {c['collective']} bucket {c['sizeBucket']} ({c['nranks']} ranks):")
        lines += [
            f"    {m['algo']}/{m['proto']} ch={m['nchannels']} calls={m['calls']} "
            f"jobs={m['jobs']} speedup={m['speedup']:.3f} ncclOwn={m['ncclOwn']}"
            for m in c["measured"]
        ]
    return "\n".join(lines)

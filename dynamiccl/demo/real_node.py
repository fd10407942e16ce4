"""`make demo-cluster` on the real node: the chart in real containers, jobs in a row, a retrain.

Entry point of `hack/demo-cluster.sh` when `real-node-0` (`hack/real-node.sh`)
is Ready and the caller is root. Holds the real tier's lock for the whole run
(`dynamiccl.testing.real_node_sessions.real_tier_lock`): brings the node up with the product and
trainer images (`hack/real-node.sh up --with-trainer`; built first if the
tree changed), installs the chart there, runs `real_sequence` and, at the end,
keeps the evidence (store, models, TuningRuns, logs) in the output directory
and uninstalls the release, so that the real tier finds the node as it left it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dynamiccl.demo.real_sequence import NTP, POLICY, RealSequence, RealSettings, run
from dynamiccl.testing.kubectl import Cluster
from dynamiccl.testing.real_node_sessions import real_tier_lock, remove_leftovers
from dynamiccl.testing.real_release import (
    JOBS_NS,
    SYSTEM_NS,
    RealRelease,
    node_up,
    other_releases,
)


def _say(msg: str) -> None:
    print(f"demo-cluster: {msg}", file=sys.stderr, flush=True)


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = RealSettings()
    p = argparse.ArgumentParser(prog="hack/demo-cluster.sh (real node)")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--bin-dir", type=Path, required=True, help="pinned helm and kubectl")
    p.add_argument("--out", type=Path, default=Path("demo-cluster-out"))
    p.add_argument("--jobs", type=int, default=d.jobs, help="jobs in a row")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps per job")
    p.add_argument("--budget-percent", type=float, default=d.budget_percent)
    p.add_argument(
        "--reuse-images", action="store_true",
        default=os.environ.get("DYNAMICCL_REAL_REUSE_IMAGES") == "1",
        help="import the images last built instead of building the tree's (if it changed)",
    )  # fmt: skip
    p.add_argument("--clean", action="store_true", help="remove what the demo created")
    return p.parse_args(argv)


def _evidence(cl: Cluster, rel: RealRelease, out: Path) -> None:
    """What stays after the release is gone: TuningRuns, the jobs' ConfigMaps, logs."""
    k = [cl.kubectl, "--kubeconfig", cl.kubeconfig]
    for what, args in (
        ("tuningruns.yaml", ["get", "tuningruns", "-n", JOBS_NS, "-o", "yaml"]),
        ("configmaps.yaml", ["get", "configmaps", "-n", JOBS_NS, "-o", "yaml"]),
        ("policy.yaml", ["get", "nccltuningpolicy", POLICY, "-o", "yaml"]),
        ("ingest.log", ["logs", "-n", SYSTEM_NS, "deploy/dynamiccl-ingest", "--tail=-1"]),
        ("operator.log", ["logs", "-n", SYSTEM_NS, "deploy/dynamiccl-operator", "--tail=-1"]),
    ):
        with contextlib.suppress(RuntimeError):
            (out / what).write_text(cl.sh(*k, *args))
    rel.keep_evidence()


def main(argv: Sequence[str] | None = None) -> int:
    a = _args(argv)
    cl = Cluster(a.kubeconfig, a.bin_dir)
    cluster_dir = Path(a.kubeconfig).resolve().parent
    cache = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rel = RealRelease(cl, cluster_dir / "node", out)
    t0 = time.monotonic()
    with real_tier_lock(cluster_dir, _say):
        remove_leftovers(cl, cluster_dir / "node", _say)
        if a.clean:
            rel.remove()
            _say("removed the real-node demo's release and namespaces")
            return 0
        others = other_releases(cl)
        if others:
            _say(
                f"another release of the chart is installed ({', '.join(others)}): its admission "
                "policies refuse this release's operator. Remove it first (the kwok demo's: "
                "hack/demo-cluster.sh --kwok --clean; another: helm uninstall)"
            )
            return 2
        images = node_up(cache, a.reuse_images, _say)
        rel.install(images, _say)
        try:
            settings = RealSettings(jobs=a.jobs, steps=a.steps, budget_percent=a.budget_percent)
            seq = RealSequence(cl, images["DYNAMICCL_IMAGE"], JOBS_NS, SYSTEM_NS, settings, _say)
            run(seq, out, images)
        finally:
            _evidence(cl, rel, out)
            with contextlib.suppress(Exception):
                cl.custom.delete_cluster_custom_object(*NTP[:2], NTP[2], POLICY)
            rel.remove()
    _say(f"done in {time.monotonic() - t0:.0f} s; files: {out} (the release is uninstalled)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real-node session killed with its release installed does not refuse the next session.

Seen in CI on 2026-12-02: a real-tier session was killed with its release of the chart
installed; the control plane resumed its state, and the next session's `helm install`
failed ("ClusterRole dynamiccl-operator ... invalid ownership metadata"). Here, on the
local control plane, a labelled namespace gets a release of the chart (the dead
session's), with or without helm's record of it (deleting a namespace deletes the record
and leaves the chart's cluster-scoped objects); the next install is refused; after
`real_node_sessions.remove_leftovers`, under the real node's lock as every session takes it,
the same install succeeds and what the dead session made is gone. No pod runs: the
release is only installed (kwok, no --wait).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from dynamiccl import constants as c
from dynamiccl.testing.kubectl import Cluster
from dynamiccl.testing.real_node_sessions import (
    RELEASE,
    SESSION_LABELS,
    real_tier_lock,
    remove_leftovers,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
CHART = Path(__file__).resolve().parents[3] / "charts" / "dynamiccl"
# the webhook selects no namespace: other tests' pods never wait on the dead release's
VALUES = {
    "webhook": {
        "namespaceSelectorExpressions": [
            {"key": "dynamiccl.io/leftover-test", "operator": "In", "values": ["none"]}
        ]
    }
}
POLICY_NAME = "0-dead-session"
POLICY = {
    "apiVersion": f"{c.GROUP}/{c.API_VERSION}",
    "kind": "NCCLTuningPolicy",
    "metadata": {"name": POLICY_NAME, "labels": dict(SESSION_LABELS)},
    "spec": {"mode": "static", "selector": {"namespaceSelector": {"matchLabels": {"x": "y"}}}},
}


def _install(cl: Cluster, ns: str, values: Path) -> subprocess.CompletedProcess[str]:
    cmd = [cl.helm, "--kubeconfig", cl.kubeconfig, "install", RELEASE, str(CHART), "-n", ns]
    return subprocess.run([*cmd, "-f", str(values)], capture_output=True, text=True, check=False)


NTP = (c.GROUP, c.API_VERSION, "nccltuningpolicies")


@pytest.mark.parametrize("record", ["kept", "lost"])
def test_a_release_a_killed_session_left_is_removed_and_the_next_install_succeeds(
    cluster: Any, tmp_path: Path, record: str
) -> None:
    bin_dir = Path(cluster.kubeconfig).parent / "bin"
    if not (bin_dir / "helm").exists():
        pytest.skip("needs the pinned helm/kubectl of a hack/cluster-up.sh cluster")
    cl = Cluster(str(cluster.kubeconfig), bin_dir)
    node_dir = Path(cluster.kubeconfig).parent / "node"
    values = tmp_path / "values.json"
    values.write_text(json.dumps(VALUES))
    suffix = uuid.uuid4().hex[:6]
    # the dead session's name as the real tier names its own; the next one's: a namespace
    # no session made (the clean-up must leave it alone)
    dead, nxt = f"dcl-real-dead-{suffix}", f"dcl-leftover-next-{suffix}"
    with real_tier_lock(node_dir.parent, print):
        remove_leftovers(cl, node_dir, print)
        cl.core.create_namespace({"metadata": {"name": dead, "labels": dict(SESSION_LABELS)}})
        cl.core.create_namespace({"metadata": {"name": nxt}})  # the next session's
        try:
            _dead_session(cl, dead, values, lost_record=record == "lost")
            refused = _install(cl, nxt, values)
            assert refused.returncode != 0
            assert "invalid ownership metadata" in refused.stderr

            removed = remove_leftovers(cl, node_dir, print)

            done = _install(cl, nxt, values)
            assert done.returncode == 0, done.stderr
            assert f"namespace/{dead}" in removed or record == "lost"
            assert f"clusterroles/{RELEASE}-operator" in removed or record == "kept"
            assert _gone(cl, dead)
            names = {
                p["metadata"]["name"] for p in cl.custom.list_cluster_custom_object(*NTP)["items"]
            }
            assert POLICY_NAME not in names
        finally:
            with contextlib.suppress(RuntimeError):
                cl.sh(cl.helm, "--kubeconfig", cl.kubeconfig, "uninstall", RELEASE, "-n", nxt)
            with contextlib.suppress(Exception):
                cl.core.delete_namespace(nxt)
            remove_leftovers(cl, node_dir, print)


def _dead_session(cl: Cluster, ns: str, values: Path, lost_record: bool) -> None:
    """What a session killed with its release installed leaves: the release, its policy."""
    assert _install(cl, ns, values).returncode == 0
    cl.custom.create_cluster_custom_object(*NTP, POLICY)
    if lost_record:  # its namespace went first (a clean-up cut short): helm's record with it
        kubectl = [cl.kubectl, "--kubeconfig", cl.kubeconfig]
        cl.sh(*kubectl, "delete", "namespace", ns, "--wait", "--timeout=300s")


def _gone(cl: Cluster, ns: str) -> bool:
    with contextlib.suppress(Exception):
        cl.core.read_namespace(ns)
        return False
    return True

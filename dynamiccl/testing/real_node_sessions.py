"""Sessions on the real node: their lock, their labels, and what a dead one left.

The control plane's state outlives a run: `hack/cluster-up.sh` resumes etcd where it
stopped. A session killed while it used the real node (a CI machine stopped under a
running real tier, Ctrl-C in a long test) leaves its release of the chart behind.
Seen in CI on 2026-12-02: the next session's `helm install` was refused, "ClusterRole
dynamiccl-operator exists and cannot be imported into the current release: invalid
ownership metadata", and the e2e learning test skipped for the dead release's ingest.

The sessions that use the real node (the real test tier, the real-node demo, and the e2e
learning test, whose release would share the cluster with theirs) hold the real-tier lock
(`real_tier_lock`: the chart's cluster-scoped objects and the operator that watches every
namespace exist once per cluster) and label what they create with `SESSION_LABEL`.
Whoever holds the lock is therefore the only live session: every labelled object (and
namespace named as sessions name theirs, `SESSION_PREFIXES`), and every release of the
chart named `RELEASE` in such a namespace or in one that is gone, was left by a dead one.
`remove_leftovers` removes them before the holder installs its own: the releases (helm
uninstall), the chart's cluster-scoped objects whose release namespace is such a
namespace (deleting a namespace deletes helm's record of its release but not those), the
labelled policies, volumes and namespaces, and the volumes' directories on the node. A
release of the chart under another name, or in a namespace no session made, is not
touched (the demo's `real_release.other_releases` names it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dynamiccl import constants as c

RELEASE: Final = "dynamiccl"  # the name every session on the real node gives its release
LOCK_WAIT_S: Final = 1800
# on every namespace, volume and policy a session on the real node makes
SESSION_LABEL: Final = "dynamiccl.io/real-node-session"
SESSION_LABELS: Final = {SESSION_LABEL: "true"}
# the names the real tier (tests/real/conftest.py) and the real-node demo
# (dynamiccl/testing/real_release.py SYSTEM_NS) give their release namespaces: sessions before
# 2026-12-02 did not label theirs
SESSION_PREFIXES: Final = ("dcl-real-", "dcl-demo-real")
HELM_NAMESPACE_ANNOTATION: Final = "meta.helm.sh/release-namespace"
# the chart's cluster-scoped kinds (charts/dynamiccl/templates), as kubectl names them
CLUSTER_KINDS: Final = (
    "clusterroles.rbac.authorization.k8s.io",
    "clusterrolebindings.rbac.authorization.k8s.io",
    "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    "validatingadmissionpolicies.admissionregistration.k8s.io",
    "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    "clusterkopfpeerings.kopf.dev",
    f"nccltuningpolicies.{c.GROUP}",  # defaultPolicy.enabled
)
GONE_TIMEOUT_S: Final = 300

Say = Callable[[str], None]


@contextlib.contextmanager
def real_tier_lock(cluster_dir: Path, say: Say) -> Iterator[None]:
    """The real tier's exclusive lock on the cluster's real node, waited for."""
    fd = os.open(cluster_dir / "real-tier.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > float(os.environ.get("DYNAMICCL_REAL_LOCK_WAIT_S", LOCK_WAIT_S)):
                    raise RuntimeError(f"the real node stayed locked for {waited:.0f} s") from None
                if int(waited) % 60 == 0:
                    say("waiting for the real node (a real-tier session holds its lock)")
                time.sleep(1)
        if time.monotonic() - start > 1:
            say(f"got the real node's lock after {time.monotonic() - start:.0f} s")
        yield
    finally:
        os.close(fd)  # releases the lock


def dead_release_namespaces(
    releases: Sequence[Mapping[str, Any]], session_ns: Collection[str], existing_ns: Collection[str]
) -> list[str]:
    """The namespaces of `RELEASE` releases (`helm list -A --all -o json`) a dead session left:
    in a namespace a session made, or in one that is gone."""
    return sorted(
        {
            str(r["namespace"])
            for r in releases
            if r.get("name") == RELEASE
            and (r.get("namespace") in session_ns or r.get("namespace") not in existing_ns)
        }
    )


def orphans(
    objects: Sequence[Mapping[str, Any]], session_ns: Collection[str], existing_ns: Collection[str]
) -> list[str]:
    """Names of the chart's cluster-scoped objects (`kubectl get -o json` items of release
    `RELEASE`) whose release namespace a session made or is gone."""
    names = []
    for o in objects:
        meta = o.get("metadata", {})
        owner = (meta.get("annotations") or {}).get(HELM_NAMESPACE_ANNOTATION)
        if owner is not None and (owner in session_ns or owner not in existing_ns):
            names.append(str(meta["name"]))
    return sorted(names)


def remove_leftovers(cl: Any, node_dir: Path, say: Say) -> list[str]:
    """Remove what dead real-node sessions left (the caller holds the real-tier lock); what
    was removed, as `kind/name`. `cl`: a `testing.kubectl.Cluster`."""
    items = cl.core.list_namespace().items
    existing = {n.metadata.name for n in items}
    session = {n.metadata.name for n in items if _of_a_session(n.metadata)}
    removed = _releases(cl, session, existing, say) + _cluster_objects(cl, session, existing)
    label = f"{SESSION_LABEL}=true"
    for kind in (f"nccltuningpolicies.{c.GROUP}", "persistentvolumes"):
        out = _kubectl(cl, "delete", kind, "-l", label, "--ignore-not-found", "-o", "name")
        removed += [w for w in out if "/" in w]  # not "No resources found"
    for ns in sorted(session):
        # a pod on a node whose kubelet is down (the real node after a restart, before
        # real-node.sh up) would hold its namespace in Terminating; the kubelet stops the
        # containers of pods that are gone once it runs
        _kubectl(cl, "delete", "pods", "--all", "-n", ns, "--force", "--grace-period=0")
        removed.append(f"namespace/{ns}")
    if session:
        _kubectl(cl, "delete", "namespaces", *sorted(session), "--ignore-not-found",
                 "--wait", f"--timeout={GONE_TIMEOUT_S}s")  # fmt: skip
        for ns in session:
            shutil.rmtree(node_dir / "volumes" / ns, ignore_errors=True)
    if removed:
        say(f"removed what a dead real-node session left: {', '.join(removed)}")
    return removed


def _of_a_session(meta: Any) -> bool:
    return bool((meta.labels or {}).get(SESSION_LABEL)) or meta.name.startswith(SESSION_PREFIXES)


def _kubectl_out(cl: Any, *args: str) -> str:
    return str(cl.sh(cl.kubectl, "--kubeconfig", cl.kubeconfig, *args))


def _kubectl(cl: Any, *args: str) -> list[str]:
    return _kubectl_out(cl, *args).split()


def _releases(cl: Any, session: set[str], existing: set[str], say: Say) -> list[str]:
    helm = [cl.helm, "--kubeconfig", cl.kubeconfig]
    releases = json.loads(cl.sh(*helm, "list", "-A", "--all", "-o", "json") or "[]")
    removed = []
    for ns in dead_release_namespaces(releases, session, existing):
        try:
            cl.sh(*helm, "uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s")
        except RuntimeError as exc:  # what it could not remove, the steps after it do
            say(f"helm uninstall {RELEASE} -n {ns}: {exc}")
        removed.append(f"release/{ns}/{RELEASE}")
    return removed


def _cluster_objects(cl: Any, session: set[str], existing: set[str]) -> list[str]:
    """The chart's cluster-scoped objects whose release a dead session installed."""
    removed = []
    for kind in CLUSTER_KINDS:
        got = _kubectl_out(cl, "get", kind, "-o", "json", "-l", f"{c.LABEL_INSTANCE}={RELEASE}")
        names = orphans(json.loads(got)["items"], session, existing)
        if names:
            _kubectl(cl, "delete", kind, *names, "--ignore-not-found")
            removed += [f"{kind.split('.')[0]}/{n}" for n in names]
    return removed

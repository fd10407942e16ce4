"""The one cluster of the integration tier: a reachable kube-apiserver, or a failure.

``cluster_kubeconfig`` (session) picks the first reachable kubeconfig of

  1. ``$DYNAMICCL_KUBECONFIG``,
  2. ``$KUBECONFIG`` (its first file when it is a list),
  3. ``$DYNAMICCL_CACHE/cluster/kubeconfig`` (``DYNAMICCL_CACHE`` defaults to
     ``~/.cache/dynamiccl/v1``: the local control plane of hack/cluster-up.sh),

where reachable means the API server answers ``/version`` within 5 s. When none
is, it runs ``bash hack/cluster-up.sh`` (idempotent; at most an hour, in its own
session so that a timeout kills the whole process group) and uses the kubeconfig
that script prints as its last line. The tier never skips for want of a
cluster: if that one is not reachable either, the test fails with the tail of
cluster-up.sh's stderr.

The cluster is left running at the end of the session, whoever started it: the
e2e tier and the next run reuse it (``make cluster-down`` stops it).

``admin_api`` (session) is an API client for that kubeconfig. Modules build on
these two (CRDs, namespaces, nodes of their own); they never look for a cluster
themselves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_UP = ROOT / "hack" / "cluster-up.sh"
CLUSTER_UP_TIMEOUT_S = 3600
STDERR_TAIL_LINES = 40


def _candidates() -> list[Path]:
    cache = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))
    found: list[Path] = []
    for var in ("DYNAMICCL_KUBECONFIG", "KUBECONFIG"):
        value = os.environ.get(var, "")
        if value:  # KUBECONFIG may be a list: the first file is the one we talk to
            found.append(Path(value.split(os.pathsep)[0]).expanduser())
    found.append(cache / "cluster" / "kubeconfig")
    return found


def _reachable(kubeconfig: Path) -> bool:
    if not kubeconfig.is_file():
        return False
    try:
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        try:
            k8s.VersionApi(api).get_code(_request_timeout=5)
        finally:
            api.close()
    except Exception:
        return False
    return True


def _cluster_up() -> tuple[int | None, str, str]:
    """Run hack/cluster-up.sh: (exit code or None on timeout, stdout, stderr)."""
    proc = subprocess.Popen(
        ["bash", str(CLUSTER_UP)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout kills all of it
    )
    try:
        out, err = proc.communicate(timeout=CLUSTER_UP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # something outside the group still holds a pipe
            proc.kill()
            out, err = "", ""
        return None, out, err
    return proc.returncode, out, err


@pytest.fixture(scope="session")
def cluster_kubeconfig() -> Path:
    """The admin kubeconfig of a reachable cluster (started by hack/cluster-up.sh if needed)."""
    tried = _candidates()
    for kubeconfig in tried:
        if _reachable(kubeconfig):
            return kubeconfig
    code, out, err = _cluster_up()
    printed = out.strip().splitlines()
    if printed:
        kubeconfig = Path(printed[-1].strip()).expanduser()
        if _reachable(kubeconfig):
            return kubeconfig
    ended = (
        f"exited {code}"
        if code is not None
        else f"was killed after {CLUSTER_UP_TIMEOUT_S} s (its whole process group)"
    )
    tail = "\n".join(err.rstrip().splitlines()[-STDERR_TAIL_LINES:])
    pytest.fail(
        f"no reachable kube-apiserver (tried {', '.join(map(str, tried))}); "
        f"hack/cluster-up.sh {ended} and printed {repr(printed[-1]) if printed else 'nothing'}"
        f"\n--- last {STDERR_TAIL_LINES} lines of its stderr ---\n{tail}",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def admin_api(cluster_kubeconfig: Path) -> Iterator[k8s.ApiClient]:
    """An API client with the admin credentials of ``cluster_kubeconfig``."""
    api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster_kubeconfig)
    )
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]

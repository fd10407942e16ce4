"""The node's NCCL topology file reaches a tuned container on the real node (issue 30.4).

The chart's node agent publishes the real node's file (``nodeAgent.ncclTopoFile=always``:
the node has no GPU, so ``auto`` finds no hidden NVSwitch; ``interval=10`` so that the
restarted agent publishes within seconds), the operator copies it into the job's
ConfigMap, the webhook adds the init step and ``NCCL_TOPO_FILE``, all in a namespace
enforcing Pod Security ``restricted`` (no hostPath). Each pod's main container prints the
variable and the file it names; both must be the node's. Restores the values after.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dynamiccl import constants as c
from dynamiccl.operator.webhook import mutate
from dynamiccl.testing.real_manifests import NODE_NAME
from tests.real import training as t
from tests.real.conftest import RELEASE, RealCluster, Release, wait_until

pytestmark = [pytest.mark.real]

PRINT = (
    "import json, os; p = os.environ.get('NCCL_TOPO_FILE', ''); "
    "print(json.dumps({'env': p, 'xml': open(p).read() if p and os.path.exists(p) else None}))"
)


def _upgrade(real_cluster: RealCluster, release: Release, mode: str, interval: int) -> None:
    real_cluster.helm_run(
        "upgrade", RELEASE, "charts/dynamiccl", "-n", release.namespace,
        "-f", str(release.values_file()),
        "--set", f"nodeAgent.ncclTopoFile={mode}", "--set", f"nodeAgent.interval={interval}",
        "--wait", "--timeout", "180s",
    )  # fmt: skip


@pytest.fixture
def always(real_cluster: RealCluster, release: Release) -> Iterator[Release]:
    t.tuning_policy(real_cluster)
    _upgrade(real_cluster, release, "always", 10)
    try:
        yield release
    finally:
        _upgrade(real_cluster, release, "auto", 300)
        t.delete_policy(real_cluster)


def _published(real_cluster: RealCluster) -> str | None:
    custom: Any = real_cluster.custom()
    obj = custom.get_cluster_custom_object(c.GROUP, c.API_VERSION, "nodetopologies", NODE_NAME)
    f = (obj.get("status") or {}).get("ncclTopoFile")
    return None if f is None else str(f["xml"])


def _printing_job(image: str) -> dict[str, Any]:
    """The tier's PyTorchJob, its main container printing NCCL_TOPO_FILE and that file."""
    job = t.pytorchjob("topo", image, t.NONROOT_POD, t.HARDENED_CONTAINER)
    spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    spec.pop("volumes")
    [ct] = spec["containers"]
    ct.pop("volumeMounts")
    ct["command"] = ["python", "-c", PRINT]
    return job


def test_the_nodes_topology_file_reaches_the_container(
    real_cluster: RealCluster, always: Release
) -> None:
    wait_until(
        "the node agent publishes its file", lambda: _published(real_cluster) is not None, 120
    )
    xml = _published(real_cluster)
    ns = t.job_namespace(real_cluster, f"dcl-topo-{uuid.uuid4().hex[:4]}", "restricted")
    core: Any = real_cluster.core()
    try:
        image = f"{real_cluster.image_repository}:{real_cluster.image_tag}"
        t.create_job(real_cluster, ns, _printing_job(image))
        for pod in t.wait_done(real_cluster, ns, "topo", 300):
            names = [i.name for i in pod.spec.init_containers]
            assert mutate.INIT_TOPO_FILE in names, names
            log = core.read_namespaced_pod_log(pod.metadata.name, ns, container="pytorch")
            seen = json.loads(log.strip().splitlines()[-1])
            assert seen["env"] == mutate.TOPO_FILE
            assert seen["xml"] == xml
            print(f"\n{pod.metadata.name}: NCCL_TOPO_FILE={seen['env']} holds the node's file")
    finally:
        t.delete_namespace(real_cluster, ns)

"""The one Kubernetes client setup every component uses.

Credentials: an explicit kubeconfig file when one is given; otherwise the pod's
in-cluster ServiceAccount, then the default kubeconfig ($KUBECONFIG or
~/.kube/config) for runs outside a cluster. Timeouts: one policy, per request,
named here (`REQUEST_TIMEOUT_S` on the data path: sidecar, ingest, node agent;
`CONTROL_TIMEOUT_S` for the operator's reconciles, which read and write larger
objects). The kubernetes package is imported on first use only: the sidecar and
the node agent start without paying for it when they never talk to the cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

REQUEST_TIMEOUT_S: Final = 5.0
CONTROL_TIMEOUT_S: Final = 10.0


def load_configuration(kubeconfig: str | Path | None = None) -> Any:
    """A filled `kubernetes.client.Configuration` (see the module docstring for the order)."""
    from kubernetes import client, config  # noqa: PLC0415 - heavy, load on use

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cfg
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return cfg


def api_client(kubeconfig: str | Path | None = None, *, pool_maxsize: int | None = None) -> Any:
    """A `kubernetes.client.ApiClient` on `load_configuration(kubeconfig)`.

    `pool_maxsize`: connections kept open (one per worker thread avoids TLS
    re-handshakes); the client's default when None.
    """
    from kubernetes import client  # noqa: PLC0415

    cfg = load_configuration(kubeconfig)
    if pool_maxsize is not None:
        cfg.connection_pool_maxsize = pool_maxsize
    return client.ApiClient(cfg)

"""SHARP / CollNet capability.

Switch-side SHARP support is not visible from a host (it lives in the
aggregation manager on the subnet manager). What a host shows is whether the
SHARP collective library (``libsharp_coll``, needed by NCCL's CollNet plugin)
is installed and whether a SHARP daemon runs. ``capable`` is:

* the admin override (node label ``dynamiccl.io/sharp-override``) when set;
* otherwise true only on an InfiniBand fabric with the SHARP library or daemon
  present, and the ``basis`` says so; false when neither is present; unknown
  when none of the host's library directories is visible (not mounted).
"""

from __future__ import annotations

from typing import Final

from dynamiccl.api.node_topology import Sharp
from dynamiccl.api.topology import Fabric
from dynamiccl.node_agent.hostroot import HostRoot

LIB_DIRS: Final = (
    "/opt/mellanox/sharp/lib",
    "/opt/hpcx/sharp/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
)
LIB_PREFIX: Final = "libsharp_coll.so"
DAEMONS: Final = ("sharpd",)


def _libraries(host: HostRoot) -> tuple[list[str], bool]:
    """SHARP libraries found, and whether any library directory was visible at all."""
    found: list[str] = []
    visible = False
    for d in LIB_DIRS:
        names = host.listdir(d)
        visible = visible or names is not None
        for name in names or []:
            if name.startswith(LIB_PREFIX):
                found.append(f"{d}/{name}")
                break
    return found, visible


def _daemons(host: HostRoot) -> list[str]:
    found: list[str] = []
    for pid in host.listdir("/proc") or []:
        if not pid.isdigit():
            continue
        comm = host.read_text(f"/proc/{pid}/comm")
        if comm is not None and comm.strip() in DAEMONS:
            found.append(f"process {comm.strip()} (pid {pid})")
    return found


def scan(host: HostRoot, fabric: Fabric | None, override: bool | None) -> Sharp:
    """SHARP evidence on this host and the resulting capability."""
    libs, visible = _libraries(host)
    evidence = libs + _daemons(host)
    if override is not None:
        return Sharp(
            capable=override,
            basis="admin override label",
            evidence=evidence,
            override=override,
        )
    if fabric is None:
        return Sharp(capable=None, basis="fabric unknown", evidence=evidence)
    if fabric is not Fabric.INFINIBAND:
        return Sharp(capable=False, basis=f"fabric is {fabric.value}", evidence=evidence)
    if evidence:
        return Sharp(
            capable=True,
            basis="InfiniBand with SHARP library/daemon; switch support not visible from host",
            evidence=evidence,
        )
    if not visible:
        # The host's library directories are not mounted: absence is not proven.
        return Sharp(capable=None, basis="host library directories not visible", evidence=[])
    return Sharp(capable=False, basis="no SHARP library or daemon on this host", evidence=[])

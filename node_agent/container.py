"""The container boundary around the process running discovery.

cgroup version, container runtime, Kubernetes, whether the IPC and PID
namespaces are the host's (the kernel's initial namespaces have fixed inode
numbers, include/linux/proc_ns.h), and who shares ``/dev/shm``. GPU counts
(visible vs on the node) are filled in by ``discover``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.node_topology import Container, DevShm, ShmSharing
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot

INIT_IPC_NS: Final = "ipc:[4026531839]"
INIT_PID_NS: Final = "pid:[4026531836]"
_OCTAL = re.compile(r"\\([0-7]{3})")
_SIZE = re.compile(r"^([0-9]{1,20})([kmgKMG]?)$")
_RUNTIME_MARKERS: Final = (
    ("cri-containerd", "containerd"),
    ("/var/lib/containerd/", "containerd"),
    ("containerd", "containerd"),
    ("crio-", "cri-o"),
    ("libpod", "podman"),
    ("/var/lib/containers/storage", "cri-o"),
    ("/var/lib/docker/", "docker"),
    ("docker", "docker"),
)


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo."""

    root: str
    mount_point: str
    fstype: str
    source: str
    super_options: str


def _unescape(text: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[Mount]:
    """Mounts in /proc/PID/mountinfo format; malformed lines are skipped."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 3:
            continue
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fields[sep + 1],
                source=_unescape(fields[sep + 2]),
                super_options=fields[sep + 3] if len(fields) > sep + 3 else "",
            )
        )
    return mounts


def parse_cgroup(text: str) -> list[tuple[str, str, str]]:
    """(hierarchy id, controllers, path) per line of /proc/PID/cgroup."""
    out: list[tuple[str, str, str]] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[2].startswith("/"):
            out.append((parts[0], parts[1], parts[2]))
    return out


def shm_size(options: str) -> int | None:
    """``size=`` of tmpfs super options, in bytes."""
    for opt in options.split(","):
        if opt.startswith("size="):
            m = _SIZE.match(opt[5:])
            if m:
                mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
                return int(m.group(1)) * mult
    return None


def _runtime(texts: list[str]) -> str | None:
    for marker, runtime in _RUNTIME_MARKERS:
        if any(marker in t for t in texts):
            return runtime
    return None


def _cgroup_version(host: HostRoot, lines: list[tuple[str, str, str]]) -> int | None:
    if host.exists("/sys/fs/cgroup/cgroup.controllers"):
        return 2
    if any(ctrl for _, ctrl, _ in lines):
        return 1
    if lines:
        return 2
    return None


def _ns(host: HostRoot, conds: Conditions, kind: str, init: str, field: str) -> bool | None:
    link = host.readlink(f"/proc/self/ns/{kind}")
    if link is None:
        conds.add(field, "Missing", f"/proc/self/ns/{kind}: cannot read namespace link")
        return None
    if not re.fullmatch(rf"{kind}:\[[0-9]+\]", link):
        conds.add(field, "Garbled", f"/proc/self/ns/{kind}: unexpected link {link[:40]!r}")
        return None
    return link == init


def scan(host: HostRoot, conds: Conditions) -> Container:
    """Container facts of the discovering process (GPU counts left to the caller)."""
    cg = host.read("/proc/self/cgroup")
    cg_lines = parse_cgroup(cg.text) if cg.text is not None else []
    if cg.text is None:
        conds.unreadable("container.cgroupVersion", "/proc/self/cgroup", cg.error)
    mi = host.read("/proc/self/mountinfo")
    mounts = parse_mountinfo(mi.text) if mi.text is not None else []
    if mi.text is None:
        conds.unreadable("container.devShm", "/proc/self/mountinfo", mi.error)

    ipc_host = _ns(host, conds, "ipc", INIT_IPC_NS, "container.ipcHost")
    pid_host = _ns(host, conds, "pid", INIT_PID_NS, "container.pidHost")

    texts = [p for _, _, p in cg_lines] + [m.root for m in mounts]
    texts += [m.super_options for m in mounts if m.mount_point == "/"]
    runtime = _runtime(texts)
    root_overlay = any(m.mount_point == "/" and m.fstype == "overlay" for m in mounts)
    kube = any("kubepods" in t or "/var/lib/kubelet/pods/" in t for t in texts)
    kube = kube or host.exists("/var/run/secrets/kubernetes.io/serviceaccount")
    # Marker files alone are weak: images keep /.dockerenv when run as VMs.
    weak = "docker" if host.exists("/.dockerenv") else None
    weak = weak or ("podman" if host.exists("/run/.containerenv") else None)

    in_container: bool | None
    strong = runtime is not None or root_overlay or kube or pid_host is False
    if strong or (weak is not None and pid_host is None):
        in_container = True
    elif pid_host is True:
        in_container = False
    else:
        in_container = None
        conds.add("container.inContainer", "Unknown", "no runtime markers and no pid namespace")
    runtime = runtime or weak

    shm_mounts = [m for m in mounts if m.mount_point == "/dev/shm"]
    shm = shm_mounts[-1] if shm_mounts else None
    sharing = ShmSharing.UNKNOWN
    if shm is not None and "kubernetes.io~empty-dir" in shm.root:
        sharing = ShmSharing.POD
    elif in_container is False:
        sharing = ShmSharing.HOST
    elif shm is not None and shm.source == "shm":
        sharing = ShmSharing.CONTAINER
    elif in_container and ipc_host:
        sharing = ShmSharing.HOST
    if sharing is ShmSharing.UNKNOWN and mi.text is not None:
        conds.add("container.devShm", "Unknown", "cannot tell who shares /dev/shm")
    size = shm_size(shm.super_options) if shm is not None else None

    return Container(
        in_container=in_container,
        runtime=runtime if in_container else None,
        orchestrator="kubernetes" if kube else None,
        cgroup_version=_cgroup_version(host, cg_lines),
        ipc_host=ipc_host,
        pid_host=pid_host,
        dev_shm=DevShm(sharing=sharing, size_bytes=size),
    )

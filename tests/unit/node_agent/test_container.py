"""Container boundary: runtime, namespaces, /dev/shm."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.api.node_topology import ShmSharing
from dynamiccl.node_agent import container
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot


def test_mountinfo_parsing() -> None:
    line = "36 35 98:0 /mnt\\0401 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    (m,) = container.parse_mountinfo(line + "\nnot a mount line\n")
    assert (m.root, m.mount_point, m.fstype, m.source) == ("/mnt 1", "/mnt2", "ext3", "/dev/root")


@given(st.text(max_size=300))
def test_parsers_never_raise(text: str) -> None:
    container.parse_mountinfo(text)
    container.parse_cgroup(text)
    container.shm_size(text)


def test_shm_size() -> None:
    assert container.shm_size("rw,size=65536k,mode=755") == 64 << 20
    assert container.shm_size("rw,size=1g") == 1 << 30
    assert container.shm_size("rw") is None


def test_docker_v1_container_with_host_ipc(tmp_path: Path) -> None:
    (tmp_path / "proc/self/ns").mkdir(parents=True)
    os.symlink("ipc:[4026531839]", tmp_path / "proc/self/ns/ipc")
    os.symlink("pid:[4026532200]", tmp_path / "proc/self/ns/pid")
    (tmp_path / "proc/self/cgroup").write_text(
        "12:memory:/docker/0123abcd\n11:cpu,cpuacct:/docker/0123abcd\n"
    )
    (tmp_path / "proc/self/mountinfo").write_text(
        "1 0 0:50 / / rw - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/X\n"
        "2 1 0:21 / /dev/shm rw - tmpfs tmpfs rw,size=32g\n"
    )
    conds = Conditions()
    c = container.scan(HostRoot(tmp_path), conds)
    assert (c.in_container, c.runtime, c.orchestrator, c.cgroup_version) == (
        True,
        "docker",
        None,
        1,
    )
    assert (c.ipc_host, c.pid_host) == (True, False)
    assert c.dev_shm.sharing is ShmSharing.HOST
    assert c.dev_shm.size_bytes == 32 << 30
    assert len(conds) == 0


def test_pod_with_memory_emptydir_shm(tmp_path: Path) -> None:
    (tmp_path / "proc/self/ns").mkdir(parents=True)
    os.symlink("ipc:[4026532001]", tmp_path / "proc/self/ns/ipc")
    os.symlink("pid:[4026532002]", tmp_path / "proc/self/ns/pid")
    (tmp_path / "proc/self/cgroup").write_text("0::/\n")
    (tmp_path / "proc/self/mountinfo").write_text(
        "1 0 0:50 / / rw - overlay overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/Y\n"
        "9 1 0:60 /var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/dshm /dev/shm rw"
        " - tmpfs tmpfs rw,size=8g\n"
    )
    c = container.scan(HostRoot(tmp_path), Conditions())
    assert (c.runtime, c.orchestrator) == ("cri-o", "kubernetes")
    assert c.dev_shm.sharing is ShmSharing.POD


def test_nothing_readable_is_unknown(tmp_path: Path) -> None:
    conds = Conditions()
    c = container.scan(HostRoot(tmp_path), conds)
    assert (c.in_container, c.ipc_host, c.cgroup_version) == (None, None, None)
    assert {"container.ipcHost", "container.pidHost", "container.inContainer"} <= {
        x.field for x in conds.items()
    }


def test_fixture_pod(fixture_root: Any) -> None:
    c = container.scan(HostRoot(fixture_root("container-2of8")), Conditions())
    assert (c.runtime, c.orchestrator, c.ipc_host) == ("containerd", "kubernetes", False)

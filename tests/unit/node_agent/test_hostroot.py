"""HostRoot: every host access is redirectable, symlinks resolve inside the root."""

from __future__ import annotations

import os
from pathlib import Path

from dynamiccl.node_agent.hostroot import HostRoot


def test_relative_and_absolute_links_stay_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink(
        "../../../devices/pci0000:00/0000:00:01.0",
        tmp_path / "sys/bus/pci/devices/0000:00:01.0",
    )
    # An absolute target means "/" of the host, i.e. the root, not this machine's /.
    os.symlink("/sys/devices/pci0000:00", tmp_path / "abs")
    host = HostRoot(tmp_path)
    assert (
        host.realpath("/sys/bus/pci/devices/0000:00:01.0") == "/sys/devices/pci0000:00/0000:00:01.0"
    )
    assert host.realpath("/abs/0000:00:01.0/..") == "/sys/devices/pci0000:00"
    assert host.realpath("/missing/x") is None


def test_link_loops_do_not_hang(tmp_path: Path) -> None:
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    assert HostRoot(tmp_path).realpath("/a") is None


def test_reads_never_raise(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "f").write_bytes(b"ok\xff\n")
    host = HostRoot(tmp_path)
    assert host.read("/f").text == "ok\ufffd\n"
    assert host.read("/nope").error == "missing"
    res = host.read("/dir")
    assert res.text is None
    assert res.error
    assert host.listdir("/nope") is None
    assert host.readlink("/f") is None


def test_magic_links_are_read_not_followed(tmp_path: Path) -> None:
    (tmp_path / "proc/self/ns").mkdir(parents=True)
    os.symlink("ipc:[4026531839]", tmp_path / "proc/self/ns/ipc")
    assert HostRoot(tmp_path).readlink("/proc/self/ns/ipc") == "ipc:[4026531839]"


def test_recorded_roots_answer_tools_from_files(tmp_path: Path) -> None:
    (tmp_path / ".dynamiccl-recorded").mkdir()
    (tmp_path / ".dynamiccl-recorded/out.txt").write_text("hello\n")
    host = HostRoot(tmp_path)
    assert host.run(["definitely-not-run"], record="out.txt").text == "hello\n"
    absent = host.run(["x"], record="absent.txt")
    assert absent.text is None
    assert "absent" in (absent.error or "")


def test_live_roots_run_tools(tmp_path: Path) -> None:
    host = HostRoot(tmp_path)
    assert host.recorded is None
    assert host.run(["echo", "hi"], record="unused").text == "hi\n"
    failed = host.run(["false"], record="unused")
    assert failed.text is None
    assert "exit 1" in (failed.error or "")
    assert "not found" in (host.run(["no-such-tool-xyz"], record="u").error or "")

"""The shared-memory file works across user ids (issue 16).

The sidecar runs as uid 65532 and creates the file; the plugin opens it
``O_RDWR | O_CLOEXEC`` and maps it shared read-write inside the training
container, which runs as any other uid, or as root with every capability
dropped. Each side runs in a forked child with its own ids (this needs root to
switch; the test is skipped otherwise), in a 0777 directory like the pod's
emptyDir, with the sidecar's default umask 022.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dynamiccl.sidecar import shm

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(os.geteuid() != 0, reason="switching user ids needs root"),
]

SIDECAR_UID = 65532
TRAINING_UID = 1000
INTERVAL = 256
CHILD_TIMEOUT_S = 60


def _drop_capabilities() -> None:
    """capset(2) with empty sets: root without CAP_DAC_OVERRIDE and friends."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    libc = ctypes.CDLL(None, use_errno=True)
    hdr = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    if libc.syscall(126, ctypes.byref(hdr), data) != 0:  # SYS_capset on x86_64
        raise OSError(ctypes.get_errno(), "capset")


def _as(uid: int | None, fn: Callable[[], None], *, no_caps: bool = False) -> str:
    """Run `fn` in a forked child as `uid` (None: stay root); '' or the child's error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code, msg = 0, b""
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            if no_caps:
                _drop_capabilities()
            os.umask(0o022)
            fn()
        except BaseException as exc:  # reported to the parent
            code, msg = 1, f"{type(exc).__name__}: {exc}".encode()
        os.write(w, msg)
        os._exit(code)
    os.close(w)
    # A forked child of a process with threads can hang (a lock held by another thread at the
    # fork): bounded, so that a hang fails this test instead of stopping the whole run.
    ready, _, _ = select.select([r], [], [], CHILD_TIMEOUT_S)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        pytest.fail(f"the forked child did not finish within {CHILD_TIMEOUT_S} s")
    with os.fdopen(r, "rb") as f:
        err = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == (1 if err else 0), err
    return err


def _open_like_the_plugin(path: Path) -> Callable[[], None]:
    """plugin/src/mapping.h: open O_RDWR|O_CLOEXEC, mmap shared read-write, write."""

    def run() -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            mm = mmap.mmap(fd, shm.FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        mm[shm.COMMS_OFF] = mm[shm.COMMS_OFF]  # a process writes its registry entry here
        mm.close()

    return run


@pytest.fixture
def volume() -> Iterator[Path]:
    """A directory like the pod's emptyDir: mode 0777, reachable by every uid."""
    d = Path(tempfile.mkdtemp(prefix="dynamiccl-shm-"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d)


def _create_as_sidecar(path: Path) -> None:
    assert _as(SIDECAR_UID, lambda: shm.create(path, INTERVAL)) == ""
    st = path.stat()
    assert st.st_uid == SIDECAR_UID
    assert stat.S_IMODE(st.st_mode) == shm.SHM_MODE


def test_training_container_with_another_uid_opens_read_write(volume: Path) -> None:
    path = volume / "dynamiccl.shm"
    _create_as_sidecar(path)
    assert _as(TRAINING_UID, _open_like_the_plugin(path)) == ""
    # the sidecar maps it too, as it does for the whole job
    assert _as(SIDECAR_UID, lambda: shm.ShmFile(path).close()) == ""


def test_root_without_capabilities_opens_read_write(volume: Path) -> None:
    path = volume / "dynamiccl.shm"
    _create_as_sidecar(path)
    assert _as(None, _open_like_the_plugin(path), no_caps=True) == ""


def test_the_mode_is_what_makes_it_work(volume: Path) -> None:
    """The defect this guards against: a 0644 file (umask 022) refuses the other uid."""
    path = volume / "dynamiccl.shm"
    _create_as_sidecar(path)
    path.chmod(0o644)
    err = _as(TRAINING_UID, _open_like_the_plugin(path))
    assert "PermissionError" in err
    err = _as(None, _open_like_the_plugin(path), no_caps=True)
    assert "PermissionError" in err


def test_a_kept_file_gets_the_mode(volume: Path) -> None:
    """A restarted sidecar keeps an existing file, and fixes one an older version made."""
    path = volume / "dynamiccl.shm"
    _create_as_sidecar(path)
    path.chmod(0o644)
    ino = path.stat().st_ino
    assert _as(SIDECAR_UID, lambda: shm.create(path, INTERVAL)) == ""
    assert path.stat().st_ino == ino  # kept, not recreated
    assert stat.S_IMODE(path.stat().st_mode) == shm.SHM_MODE
    assert _as(TRAINING_UID, _open_like_the_plugin(path)) == ""

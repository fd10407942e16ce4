"""The one place that touches the host.

Every read of sysfs, procfs, /dev, /etc and every external tool call of the
node agent goes through a :class:`HostRoot`. In production the root is ``/``
(or the host's ``/`` mounted read-only into the DaemonSet pod, e.g. ``/host``);
tests point it at a committed fixture tree.

Symlinks are resolved *inside* the root: an absolute link target is re-rooted,
so a host tree mounted at ``/host`` resolves exactly like the host itself.

A root that contains ``.dynamiccl-recorded/`` is a recording: NVML and
nvidia-smi answers come from the JSON/text files in it (a missing file means
"tool absent"), never from the machine the tests run on.
"""

from __future__ import annotations

import os
import posixpath
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

RECORDED_DIR: Final = ".dynamiccl-recorded"
MAX_READ: Final = 1 << 20
_MAX_HOPS: Final = 40


@dataclass(frozen=True)
class ReadResult:
    """Text of a file, or why there is none (``missing`` or an OS error string)."""

    text: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.text is not None


class HostRoot:
    """A redirectable view of the host filesystem."""

    def __init__(self, root: Path | str = "/") -> None:
        self.root = Path(root).resolve()
        rec = self.root / RECORDED_DIR
        self.recorded: Path | None = rec if rec.is_dir() else None

    def __repr__(self) -> str:
        return f"HostRoot({str(self.root)!r})"

    # -- paths -----------------------------------------------------------------
    def _host(self, path: str) -> Path:
        rel = path.lstrip("/")
        return self.root / rel if rel else self.root

    def realpath(self, path: str) -> str | None:
        """Host-absolute canonical path of ``path`` (symlinks followed inside the root)."""
        parts = [p for p in path.split("/") if p and p != "."]
        done: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if done:
                    done.pop()
                continue
            candidate = "/" + "/".join([*done, part])
            try:
                st = os.lstat(self._host(candidate))
            except OSError:
                return None
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_HOPS:
                    return None
                target = os.readlink(self._host(candidate))
                if target.startswith("/"):
                    done = []
                parts = [p for p in target.split("/") if p and p != "."] + parts
                continue
            done.append(part)
        return "/" + "/".join(done)

    # -- reads -----------------------------------------------------------------
    def read(self, path: str) -> ReadResult:
        """Read a text file; never raises."""
        try:
            with open(self._host(path), "rb") as fh:
                data = fh.read(MAX_READ)
        except FileNotFoundError:
            return ReadResult(None, "missing")
        except OSError as exc:
            return ReadResult(None, exc.strerror or type(exc).__name__)
        return ReadResult(data.decode("utf-8", errors="replace"))

    def read_text(self, path: str) -> str | None:
        """File content or ``None``."""
        return self.read(path).text

    def exists(self, path: str) -> bool:
        return os.path.lexists(self._host(path))

    def is_dir(self, path: str) -> bool:
        return self._host(path).is_dir()

    def listdir(self, path: str) -> list[str] | None:
        """Sorted entries of a directory, ``None`` if it cannot be listed."""
        try:
            return sorted(os.listdir(self._host(path)))
        except OSError:
            return None

    def readlink(self, path: str) -> str | None:
        """Raw link target (also for magic links like /proc/self/ns/ipc)."""
        try:
            return os.readlink(self._host(path))
        except OSError:
            return None

    def link_name(self, path: str) -> str | None:
        """Basename of a symlink's target (e.g. the driver of a PCI device)."""
        target = self.readlink(path)
        return posixpath.basename(target.rstrip("/")) if target else None

    # -- recorded answers / tools ------------------------------------------------
    def recorded_text(self, name: str) -> str | None:
        """A recorded answer file, ``None`` if absent."""
        if self.recorded is None:
            return None
        try:
            return (self.recorded / name).read_text()
        except OSError:
            return None

    def run(self, argv: list[str], *, record: str, timeout: float = 20.0) -> ReadResult:
        """Run a host tool, or return its recorded output when the root is a recording."""
        if self.recorded is not None:
            text = self.recorded_text(record)
            return ReadResult(text, None if text is not None else "not recorded (tool absent)")
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            return ReadResult(None, f"{argv[0]}: not found")
        except (OSError, subprocess.TimeoutExpired) as exc:
            return ReadResult(None, f"{argv[0]}: {exc}")
        if proc.returncode != 0:
            first = (proc.stderr or proc.stdout).strip().splitlines()[:1]
            return ReadResult(None, f"{argv[0]} exit {proc.returncode}: {' '.join(first)}")
        return ReadResult(proc.stdout)

"""A throw-away PostgreSQL server for tests and benchmarks (no Docker, no root daemon).

Needs the server binaries (Debian: `apt-get install postgresql-15`, found under
/usr/lib/postgresql/*/bin, or set PG_BIN=/path/to/bin). PostgreSQL refuses to
run as root, so when we are root the data directory is handed to the `nobody`
user and the server runs as that user (`subprocess` user=/group=).

Used by the PostgreSQL tests (tests/integration), benchmarks/ingest_bench.py and the demo
cluster's store. Stand-alone:

    python -m dynamiccl.testing.postgres   # prints the URL, serves until Ctrl-C
    python hack/pg_server.py               # the same command
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from dynamiccl.testing.ports import free_port


def find_bin_dir() -> Path:
    """Directory holding initdb and postgres (PG_BIN, else the newest Debian install)."""
    env = os.environ.get("PG_BIN")
    if env:
        return Path(env)
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    which = shutil.which("postgres")
    if which:
        return Path(which).parent
    raise FileNotFoundError(
        "PostgreSQL server binaries not found: apt-get install postgresql-15, or set PG_BIN"
    )


def available() -> bool:
    """Whether a server can be started here."""
    try:
        find_bin_dir()
    except FileNotFoundError:
        return False
    return True


class PgServer:
    """Start with `with PgServer() as pg: pg.url`; stopped and deleted on exit."""

    def __init__(self, *, fsync: bool = True, database: str = "dynamiccl") -> None:
        self.bin = find_bin_dir()
        self.fsync = fsync
        self.database = database
        self.port = 0
        self.root = Path(tempfile.mkdtemp(prefix="dynamiccl-pg-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._uid: int | None = None  # None: run as ourselves
        self._gid: int | None = None
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            self._uid, self._gid = nobody.pw_uid, nobody.pw_gid
            os.chown(self.root, nobody.pw_uid, nobody.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def _run(self, *args: str) -> None:
        subprocess.run(
            args,
            check=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            user=self._uid,
            group=self._gid,
        )

    def start(self, timeout_s: float = 60.0) -> str:
        data = self.root / "data"
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        self.port = free_port()
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.root}",
                "-c",
                "max_connections=40",
                "-c",
                "shared_buffers=32MB",
                "-c",
                f"fsync={'on' if self.fsync else 'off'}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,
            user=self._uid,
            group=self._gid,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited early; see {self.log_path}")
            try:
                self._admin(f'CREATE DATABASE "{self.database}"')
                return self.url
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _admin(self, sql: str) -> None:
        import psycopg  # noqa: PLC0415 - only the tests' venv has it

        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(sql)

    def reset(self) -> None:
        """Drop and recreate the database (a clean slate per test)."""
        self._admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{self.database}"')

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> None:
    with PgServer() as pg:
        print(pg.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()

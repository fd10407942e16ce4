"""hack/lib.sh's liveness checks of a daemon: running (`pidfile_runs`), or still being
started by `run_detached` (`pid_on_its_way`).

cluster-up.sh and real-node.sh wait for a daemon's health endpoint and give up early if
the daemon exited. Right after `start`, the recorded pid is still exec'ing towards the
daemon (subshell, setsid, env); on a loaded machine a check landed there and read
kube-controller-manager as exited (a cold `make test` failed on it: every integration
test's setup, while the daemon was in fact running). Real processes, no stand-ins.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

LIB = Path(__file__).resolve().parents[2] / "hack" / "lib.sh"


def _runs(pidfile: Path, name: str) -> str | None:
    r = subprocess.run(
        ["bash", "-c", f'source "{LIB}"; pidfile_runs "$1" "$2"', "_", str(pidfile), name],
        check=False,
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def _on_its_way(pidfile: Path, name: str) -> bool:
    r = subprocess.run(
        ["bash", "-c", f'source "{LIB}"; pid_on_its_way "$1" "$2"', "_", str(pidfile), name],
        check=False,
    )
    return r.returncode == 0


def test_a_daemon_on_its_way_or_running_counts_as_alive_a_dead_or_other_one_not(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "d.pid"
    # still in the exec chain: the pid runs bash (start's subshell; setsid and env likewise)
    chain = subprocess.Popen(["bash", "-c", "sleep 30; :"])
    # the daemon itself (here: sleep)
    daemon = subprocess.Popen(["sleep", "30"])
    try:
        pidfile.write_text(f"{chain.pid}\n")
        assert _on_its_way(pidfile, "kube-controller-manager")
        pidfile.write_text(f"{daemon.pid}\n")
        assert _on_its_way(pidfile, "sleep")
        assert not _on_its_way(pidfile, "kube-controller-manager")  # another program
        # a running component (component_pid, node_pid): its pid, only under its own name,
        # so a recycled pid is never reported or killed; the exec chain is not it yet
        assert _runs(pidfile, "sleep") == str(daemon.pid)
        assert _runs(pidfile, "kube-controller-manager") is None
        pidfile.write_text(f"{chain.pid}\n")
        assert _runs(pidfile, "kube-controller-manager") is None
    finally:
        for p in (chain, daemon):
            p.kill()
            p.wait()
    # a zombie (exited, not reaped yet) and a pid that is gone
    z = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 5
    while Path(f"/proc/{z.pid}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    pidfile.write_text(f"{z.pid}\n")
    assert not _on_its_way(pidfile, "python3")
    z.wait()
    assert not _on_its_way(pidfile, "python3")
    assert _runs(pidfile, "python3") is None
    pidfile.write_text("not-a-pid\n")
    assert not _on_its_way(pidfile, "bash")
    assert _runs(pidfile, "bash") is None
    assert not _on_its_way(tmp_path / "missing.pid", "bash")
    assert _runs(tmp_path / "missing.pid", "bash") is None

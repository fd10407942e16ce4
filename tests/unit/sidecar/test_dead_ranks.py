"""A dead or restarted rank never holds a table slot or a vote (issue 31.3, layout v4).

Real: the plugin `.so` in three processes (this test process and two children, each a
rank of the pod), the shared-memory file, the sidecar's `Participant` and the epoch
record in a file CAS store.  Nothing stands in: the children are killed with SIGKILL,
so the kernel, not the plugin, ends their leases (docs/plugin.md, "Process slots").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dynamiccl.api.epoch import KEPT_EPOCHS
from tests.unit.sidecar.test_participant import Env

ROOT = Path(__file__).resolve().parents[3]
RANK = """
import sys, time
from pathlib import Path
from dynamiccl.testing.nccl_player import Comm, Plugin, realistic_cost_table
comm = Comm(Plugin(Path(sys.argv[1])), 6, 8, 1, comm_id=2)
comm.repeat(4, 4096, realistic_cost_table(4, 4096, 8, 1), int(sys.argv[2]))
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture(name="env")
def env_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    return Env(tmp_path, ("pod0",), monkeypatch)


def _rank(env: Env, so: Path, calls: int) -> subprocess.Popen[str]:
    """A rank process of the pod that makes `calls` calls, then idles (alive) until killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK, str(so), str(calls)],
        cwd=ROOT,
        env={**os.environ, "DYNAMICCL_SHM_PATH": str(env.path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_killed_rank_holds_no_slot_and_its_restart_counts_once(env: Env, tmp_path: Path) -> None:
    so = tmp_path / "copy.so"  # Env's copy of the plugin
    idle = _rank(env, so, 1)  # a rank at call 1: it will need epoch 1 at its boundary
    try:
        for v in range(1, KEPT_EPOCHS + 1):
            assert env.commit(v, expected=2), v
        # epoch 64 would take epoch 1's slot: the idle rank (alive) still needs epoch 1
        assert not env.commit(KEPT_EPOCHS + 1, expected=2)
        assert env.view().needs == {"pod0": 1}
    finally:
        idle.send_signal(signal.SIGKILL)
        idle.wait()
    # the rank restarts (kubelet, torchrun): a new process, a new slot; it replays the
    # history until it is where the pod is
    restarted = _rank(env, so, env.calls)
    try:
        assert sum(p.alive for p in env.shm.procs()) == 2  # this process and the restarted one
        env.participant("pod0", 2).step()  # the sidecar's next report: the live ranks' needs
        assert env.view().needs == {"pod0": KEPT_EPOCHS}
        assert env.commit(KEPT_EPOCHS + 1, expected=2)  # epoch 64 took epoch 1's slot
        assert env.shm.slot(KEPT_EPOCHS + 1)[:2] == (KEPT_EPOCHS + 1, 2)
        assert env.record().epochs[0].epoch == 2  # epoch 1 left the record with its slot
        dead = [p for p in env.shm.procs() if not p.alive]
        assert [p.pid for p in dead] == [idle.pid]  # its slot and needs word are still there
        assert dead[0].needs[0] == 1  # and count for nothing
    finally:
        restarted.send_signal(signal.SIGKILL)
        restarted.wait()


@pytest.mark.parametrize("kill", [False, True])
def test_a_lease_is_held_exactly_while_its_process_lives(
    env: Env, tmp_path: Path, kill: bool
) -> None:
    rank = _rank(env, tmp_path / "copy.so", 1)
    mine = {p.pid: p for p in env.shm.procs()}
    assert mine[os.getpid()].alive
    assert mine[rank.pid].alive
    if kill:
        rank.send_signal(signal.SIGKILL)
    else:
        rank.terminate()  # an ordinary exit: no finalize call reaches the plugin either
    rank.wait()
    after = {p.pid: p for p in env.shm.procs()}
    assert after[os.getpid()].alive  # this process's own lease, tested through another fd
    assert not after[rank.pid].alive

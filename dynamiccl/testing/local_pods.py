"""One run of a job's pods as local processes: each pod's sidecar, then its ranks; wait; stop.

For tools without a cluster (`hack/gpu_ddp.py`: real PyTorch DDP ranks on a GPU, with the
injected sidecar as `dynamiccl sidecar`; its tests play the ranks with `rank.py`).

For every pod of an `Incarnation` (already mutated by the webhook and bound):
the kubelet stand-in (`dynamiccl.testing.kubelet`) creates its volumes, runs the plugin
install init step, and starts the native sidecar — the container the webhook
injected, `dynamiccl sidecar`, with its environment — then, once the sidecar
has created the shared-memory file, one rank process per GPU
(`dynamiccl.testing.rank`, the training container's environment). When every rank has
finished, the sidecars get SIGTERM (what the kubelet sends when the pod ends)
and flush what they still hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dynamiccl import constants as c
from dynamiccl.operator.webhook.mutate import INIT_INSTALL, SIDECAR
from dynamiccl.testing.kubelet import (
    TokenFor,
    Volumes,
    container,
    container_env,
    materialize,
    run_init,
)
from dynamiccl.testing.local_job import Incarnation
from dynamiccl.testing.rank import RankArgs, RankReport

SHM_WAIT_S: Final = 60.0
STOP_WAIT_S: Final = 60.0

# argv + extra env for a pod's sidecar, from its container spec and local volumes.
SidecarCommand = Callable[[Mapping[str, Any], Volumes, Path], tuple[list[str], dict[str, str]]]
Progress = Callable[[int, int], None]
# argv + env of a rank process from its arguments, their file and the training container's env
# (None: the demo's simulated rank; hack/gpu_ddp.py starts a real PyTorch DDP rank on a GPU).
RankCommand = Callable[[RankArgs, Path, Mapping[str, str]], tuple[list[str], dict[str, str]]]


class LocalRunError(RuntimeError):
    """A process of the run failed (the message carries the tail of its log)."""


@dataclass(frozen=True)
class RunConfig:
    """How to run the job once."""

    steps: int
    seed: int
    time_table: Path
    image_lib: Path  # stands for the image's /opt/dynamiccl/lib (holds the plugin .so)
    ops: Sequence[tuple[int, int, int]]
    sidecar: SidecarCommand | None  # None: no sidecar (the plugin finds no file: NCCL decides)
    training_container: str = "pytorch"
    rank_command: RankCommand | None = None


@dataclass
class RunResult:
    """What the run's processes reported."""

    ranks: list[RankReport] = field(default_factory=list)
    sidecar_logs: list[Path] = field(default_factory=list)
    sidecar_exit: list[int | None] = field(default_factory=list)
    seconds: float = 0.0


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _spawn(
    argv: list[str], env: Mapping[str, str], log: Path, cwd: Path
) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    try:
        return subprocess.Popen(argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    finally:
        out.close()


def _base_env() -> dict[str, str]:
    """The demo's own environment minus anything a pod must not inherit from it."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "DYNAMICCL_"))}
    root = str(Path(__file__).resolve().parents[2])
    keep["PYTHONPATH"] = os.pathsep.join(p for p in (root, keep.get("PYTHONPATH", "")) if p)
    return keep


def _stop(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[int | None]:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            codes.append(None)
    return codes


def _progress(paths: Sequence[Path]) -> int:
    done = 0
    for p in paths:
        with contextlib.suppress(OSError, ValueError):
            done += int(p.read_text() or 0)
    return done


def run(
    inc: Incarnation,
    cfg: RunConfig,
    root: Path,
    token_for: TokenFor,
    on_progress: Progress = lambda done, total: None,
) -> RunResult:
    """Run the job once under `root` (one directory per pod)."""
    t0 = time.monotonic()
    root = root.resolve()  # processes run in their pod's directory
    cm_name = inc.config_map["metadata"]["name"]
    base_env = _base_env()
    result = RunResult()
    sidecars: list[subprocess.Popen[bytes]] = []
    ranks: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    progress: list[Path] = []
    ops = [(int(c_), int(n), int(r)) for c_, n, r in cfg.ops]
    total = cfg.steps * sum(r for _, _, r in cfg.ops) * sum(p.nproc for p in inc.plans)
    stop = root / "STOP"
    try:
        started: list[tuple[Mapping[str, Any], Volumes, Path]] = []
        for pod, plan in zip(inc.pods, inc.plans, strict=True):
            pdir = root / plan.name
            vols = materialize(pod, pdir / "volumes", {cm_name: inc.config_map}, token_for)
            run_init(pod, container(pod, INIT_INSTALL, init=True), vols, cfg.image_lib)
            if cfg.sidecar is not None:
                argv, extra = cfg.sidecar(pod, vols, pdir)
                side = container(pod, SIDECAR, init=True)
                env = {**base_env, **container_env(pod, side, vols), **extra}
                log = pdir / "sidecar.log"
                sidecars.append(_spawn(argv, env, log, pdir))
                result.sidecar_logs.append(log)
            started.append((pod, vols, pdir))
        for (started_pod, vols, pdir), plan in zip(started, inc.plans, strict=True):
            trainer = container(started_pod, cfg.training_container)
            env = {**base_env, **container_env(started_pod, trainer, vols)}
            shm = Path(env.get(c.ENV_SHM_PATH, ""))
            deadline = time.monotonic() + SHM_WAIT_S
            while cfg.sidecar is not None and not shm.is_file() and time.monotonic() < deadline:
                if any(p.poll() is not None for p in sidecars):
                    logs = "\n".join(_tail(lg) for lg in result.sidecar_logs)
                    raise LocalRunError(f"a sidecar exited before creating its file:\n{logs}")
                time.sleep(0.05)
            for local in range(plan.nproc):
                rank = plan.first_rank + local
                args = RankArgs(
                    rank=rank,
                    nranks=inc.features.world_size,
                    nnodes=inc.features.topology.nodes,
                    comm_id=int(inc.uid.replace("-", "")[:16], 16),
                    steps=cfg.steps,
                    ops=ops,
                    time_table=str(cfg.time_table.resolve()),
                    seed=cfg.seed,
                    out=str(pdir / f"rank{rank}.json"),
                    progress=str(pdir / f"rank{rank}.progress"),
                    stop=str(stop),
                    barrier=str(root / "comm-init"),
                )
                afile = pdir / f"rank{rank}.args.json"
                afile.write_text(args.model_dump_json())
                argv, renv = [sys.executable, "-m", "dynamiccl.testing.rank", str(afile)], env
                if cfg.rank_command is not None:
                    argv, renv = cfg.rank_command(args, afile, env)
                log = pdir / f"rank{rank}.log"
                ranks.append((_spawn(argv, renv, log, pdir), Path(args.out), log))
                progress.append(Path(args.progress))
        while any(p.poll() is None for p, _, _ in ranks):
            on_progress(_progress(progress), total)
            failed = [(p, log) for p, _, log in ranks if p.poll() not in (None, 0)]
            if failed:
                raise LocalRunError(f"rank process failed:\n{_tail(failed[0][1])}")
            time.sleep(0.2)
        on_progress(_progress(progress), total)
        for p, out, log in ranks:
            if p.returncode != 0 or not out.is_file():
                raise LocalRunError(f"rank process failed:\n{_tail(log)}")
            result.ranks.append(RankReport.model_validate_json(out.read_text()))
    finally:
        stop.touch()
        _stop([p for p, _, _ in ranks], 10.0)
        result.sidecar_exit = _stop(sidecars, STOP_WAIT_S)
        result.seconds = time.monotonic() - t0
    return result


def sidecar_command(shared: Path) -> SidecarCommand:
    """How a pod's sidecar container runs here: its own command, `dynamiccl sidecar`, plus the
    job's epoch record and proposer lease as files in `shared` (on Kubernetes the TuningRun and
    a Lease; `--coordination file:DIR`), no metrics port, JSON lines (the final one says what
    was sent) and, for runs of minutes instead of hours, the shortest epoch interval (a table
    can take effect every 64 calls) and a tuner that may propose every 3 s."""

    def command(
        pod: Mapping[str, Any], vols: Volumes, pdir: Path
    ) -> tuple[list[str], dict[str, str]]:
        cmd = [str(a) for a in container(pod, SIDECAR, init=True).get("command") or []]
        if cmd[:1] != ["dynamiccl"]:
            raise LocalRunError(f"the injected sidecar runs {cmd}, not `dynamiccl ...`")
        argv = [sys.executable, "-m", "dynamiccl.cli", *cmd[1:]]
        argv += ["--coordination", f"file:{shared}", "--metrics-port", "0", "--json"]
        argv += ["--min-proposal-interval", "3", "--epoch-interval", "64"]
        argv += ["--flush-interval", "1", "--send-grace", "30"]
        return argv, {}

    return command


def sidecar_reports(result: RunResult) -> list[dict[str, Any]]:
    """The final JSON line (`"event": "stopped"`) of each sidecar's log."""
    out = []
    for log in result.sidecar_logs:
        last: dict[str, Any] = {}
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("event") == "stopped":
                    last = doc
        out.append(last)
    return out

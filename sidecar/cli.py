"""`dynamiccl sidecar`: the per-job sidecar (issue #7).

Runs until SIGTERM (the kubelet stops a native sidecar after the training
containers), then drains the rings, cuts the last batch and keeps sending for
``--send-grace`` seconds. A configuration it cannot use never stops it: it
reports ``dynamiccl_sidecar_config_valid 0``, leaves NCCL alone and re-reads the
configuration every ``--retry`` seconds (``--once``: one clear line, exit 2).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dynamiccl import constants as c

if TYPE_CHECKING:  # imported on use: `dynamiccl --help` stays fast
    from dynamiccl.sidecar.config import AgentConfig
    from dynamiccl.sidecar.metrics import AgentMetrics
    from dynamiccl.sidecar.table_changes import Backends

log = logging.getLogger("dynamiccl.sidecar")


class Level(StrEnum):
    """Log levels."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=2)


def file_backends(root: Path) -> Backends:
    """`--coordination file:DIR`'s backends of one job: its epoch record, lease and tables as
    files in `root` (DIR/<job uid>)."""
    from dynamiccl.sidecar.cas import FileCAS  # noqa: PLC0415
    from dynamiccl.sidecar.proposer import DirTableStore  # noqa: PLC0415
    from dynamiccl.sidecar.table_changes import Backends  # noqa: PLC0415

    root.mkdir(parents=True, exist_ok=True)
    return Backends(
        FileCAS(root / "record.json"), FileCAS(root / "lease.json"), DirTableStore(root / "tables")
    )


def _backends(spec: str, cfg: Any, kubeconfig: Path | None) -> Any:
    """The coordination backends named by --coordination (None: no in-run table changes)."""
    from dynamiccl.sidecar.table_changes import Backends  # noqa: PLC0415

    if spec == "none":
        return None
    if spec == "kube":
        from dynamiccl.sidecar import kube_cas  # noqa: PLC0415 - kubernetes is heavy

        record, lease, tables = kube_cas.kube_backends(cfg.job, kubeconfig)
        return Backends(
            record, lease, tables, kube_cas.kube_ballots(cfg.job, cfg.voters, kubeconfig)
        )
    if spec.startswith("file:"):
        return file_backends(Path(spec[5:]) / cfg.job.uid)
    raise _fail(f"--coordination: expected kube, file:DIR or none, got {spec!r}")


def sidecar(  # noqa: PLR0917 -- one option per knob
    config_dir: Annotated[
        Path | None, typer.Option("--config-dir", help=f"the job's ConfigMap (${c.ENV_CONFIG_DIR})")
    ] = None,
    shm: Annotated[
        Path | None, typer.Option("--shm", help=f"shared-memory file (${c.ENV_SHM_PATH})")
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="spool directory (default: beside --shm)")
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="one pass: drain, cut, send, exit")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines on stdout")] = False,
    coordination: Annotated[
        str | None,
        typer.Option(
            "--coordination",
            help=f"kube | file:DIR | none (${c.ENV_COORDINATION}; default kube in a cluster)",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="default: in-cluster credentials")
    ] = None,
    ingest_url: Annotated[str | None, typer.Option("--ingest-url")] = None,
    token_file: Annotated[Path | None, typer.Option("--token-file")] = None,
    ca_file: Annotated[Path | None, typer.Option("--ca-file")] = None,
    pod_name: Annotated[str | None, typer.Option("--pod-name")] = None,
    pod_uid: Annotated[str | None, typer.Option("--pod-uid")] = None,
    voters: Annotated[int | None, typer.Option("--voters", help="sidecars of the job")] = None,
    procs_per_pod: Annotated[int | None, typer.Option("--procs-per-pod")] = None,
    epoch_interval: Annotated[int | None, typer.Option("--epoch-interval")] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="0: no /metrics (default 9465)")
    ] = None,
    flush_interval: Annotated[float, typer.Option("--flush-interval")] = 2.0,
    drain_interval: Annotated[float, typer.Option("--drain-interval")] = 0.02,
    step_interval: Annotated[float | None, typer.Option("--step-interval")] = None,
    min_proposal_interval: Annotated[float, typer.Option("--min-proposal-interval")] = 30.0,
    send_grace: Annotated[float, typer.Option("--send-grace")] = 20.0,
    retry: Annotated[float, typer.Option("--retry", help="re-read a bad configuration")] = 10.0,
    log_level: Annotated[Level, typer.Option("--log-level")] = Level.INFO,
) -> None:
    """Run the sidecar: decision tables into shared memory, profiler rings to rewards."""
    logging.basicConfig(
        level=log_level.value.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from dynamiccl.sidecar.metrics import AgentMetrics  # noqa: PLC0415
    from dynamiccl.sidecar.runner import Options, Runner  # noqa: PLC0415
    from dynamiccl.sidecar.table_changes import Settings  # noqa: PLC0415

    overrides: dict[str, Any] = {
        "shm_path": shm,
        "state_dir": state_dir,
        "ingest_url": ingest_url,
        "token_file": token_file,
        "ca_file": ca_file,
        "pod_name": pod_name,
        "pod_uid": pod_uid,
        "voters": voters,
        "procs_per_pod": procs_per_pod,
        "epoch_interval": epoch_interval,
    }
    spec = _coordination_spec(coordination)
    port = metrics_port if metrics_port is not None else _default_metrics_port()
    stop = _stop_on_signals()
    metrics = AgentMetrics()
    served = metrics.serve(port) if port > 0 and not once else 0
    emit = _emitter(json_out)
    source = _ConfigSource(
        config_dir or Path(os.environ.get(c.ENV_CONFIG_DIR, "/etc/dynamiccl")),
        {k: v for k, v in overrides.items() if v is not None},
    )
    cfg = source.load_until_valid(once=once, stop=stop, retry_s=retry, metrics=metrics, emit=emit)
    if cfg is None:
        return
    runner = Runner(
        cfg,
        backends=_backends(spec, cfg, kubeconfig),
        metrics=metrics,
        options=Options(
            drain_s=drain_interval,
            flush_s=flush_interval,
            send_grace_s=send_grace,
            coordination=Settings.for_backend(spec == "kube", step_interval, min_proposal_interval),
        ),
    )
    emit(_started_event(cfg, served, spec))
    log.info("sidecar for %s/%s pod %s started", cfg.job.namespace, cfg.job.name, cfg.pod_name)
    try:
        if once:
            runner.once()
        else:
            runner.run(stop)
        summary = runner.summary()
        emit({"event": "stopped", **summary})
        # without --json (as injected) this line is the only record of what the pod sent
        log.info("sidecar stopped: %s", json.dumps(summary, sort_keys=True, default=str))
    finally:
        runner.close()


def _stop_on_signals() -> threading.Event:
    """An event set on SIGTERM or SIGINT, by a thread of its own.

    Setting it in the signal handler itself can deadlock: the handler runs in the main
    thread between two bytecodes, possibly while that thread holds the event's internal
    lock inside `stop.wait()` (the drain loop waits on it many times a second), and
    `Event.set` takes that same lock (seen once: a sidecar that never stopped after
    SIGTERM). The C-level handler writes the signal to a pipe instead
    (`signal.set_wakeup_fd`, async-signal-safe), and a watcher thread sets the event."""
    stop = threading.Event()
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # replaces the default action (exit)

    def watch() -> None:  # the pipe carries every signal with a Python handler: wait for ours
        while os.read(r, 1)[0] not in (signal.SIGTERM, signal.SIGINT):
            pass
        stop.set()

    threading.Thread(target=watch, name="signals", daemon=True).start()
    return stop


def _coordination_spec(flag: str | None) -> str:
    """The flag, else the environment, else kube inside a cluster and none outside."""
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    return flag or os.environ.get(c.ENV_COORDINATION) or ("kube" if in_cluster else "none")


def _default_metrics_port() -> int:
    return int(os.environ.get(c.ENV_AGENT_METRICS_PORT, "9465"))


def _emitter(json_out: bool) -> Callable[[dict[str, Any]], None]:
    """Print each event as one JSON line (with --json), else nothing."""

    def emit(doc: dict[str, Any]) -> None:
        if json_out:
            print(json.dumps(doc), flush=True)

    return emit


class _ConfigSource:
    """The job's configuration directory, read until it holds a usable configuration."""

    def __init__(self, config_dir: Path, overrides: dict[str, Any]) -> None:
        self.config_dir = config_dir
        self.overrides = overrides

    def load_until_valid(
        self,
        *,
        once: bool,
        stop: threading.Event,
        retry_s: float,
        metrics: AgentMetrics,
        emit: Callable[[dict[str, Any]], None],
    ) -> AgentConfig | None:
        """The configuration; None when stopped first. With `once`, a bad one exits 2.

        Until it is usable NCCL keeps its own choices; each new error is logged once.
        """
        from dynamiccl.sidecar.config import ConfigError, load  # noqa: PLC0415

        last_error = ""
        while True:
            try:
                cfg = load(self.config_dir, None, **self.overrides)
            except ConfigError as exc:
                if once:
                    raise _fail(f"sidecar: {exc}") from None
                metrics.config_ok.set(0)
                if str(exc) != last_error:
                    log.error("configuration unusable, NCCL keeps its own choices: %s", exc)
                    emit({"event": "config_error", "error": str(exc)})
                    last_error = str(exc)
                if stop.wait(retry_s):
                    return None
            else:
                for w in cfg.warnings:
                    log.warning("%s", w)
                return cfg


def _started_event(cfg: AgentConfig, served: int, spec: str) -> dict[str, Any]:
    return {
        "event": "started",
        "pod": cfg.pod_name,
        "shm": str(cfg.shm_path),
        "metrics_port": served,
        "coordination": spec,
        "table": cfg.table.version if cfg.table else None,
        "learned": cfg.learned,
        "warnings": list(cfg.warnings),
    }

"""`dynamiccl agent`: the per-job sidecar (issue #7).

Runs until SIGTERM (the kubelet stops a native sidecar after the training
containers), then drains the rings, cuts the last batch and keeps sending for
``--send-grace`` seconds. A configuration it cannot use never stops it: it
reports ``dynamiccl_agent_config_valid 0``, leaves NCCL alone and re-reads the
configuration every ``--retry`` seconds (``--once``: one clear line, exit 2).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from dynamiccl import constants as c

log = logging.getLogger("dynamiccl.agent")


class Level(StrEnum):
    """Log levels."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=2)


def _backends(spec: str, cfg: Any, kubeconfig: Path | None) -> Any:
    """The coordination backends named by --coordination (None: no in-run table changes)."""
    from dynamiccl.agent.cas import FileCAS  # noqa: PLC0415
    from dynamiccl.agent.coordination import Backends  # noqa: PLC0415
    from dynamiccl.agent.coordinator import DirTableStore  # noqa: PLC0415

    if spec == "none":
        return None
    if spec == "kube":
        from dynamiccl.agent.kube_cas import kube_backends  # noqa: PLC0415 - kubernetes is heavy

        record, lease, tables = kube_backends(cfg.job, kubeconfig)
        return Backends(record, lease, tables)
    if spec.startswith("file:"):
        root = Path(spec[5:]) / cfg.job.uid
        root.mkdir(parents=True, exist_ok=True)
        return Backends(
            FileCAS(root / "record.json"),
            FileCAS(root / "lease.json"),
            DirTableStore(root / "tables"),
        )
    raise _fail(f"--coordination: expected kube, file:DIR or none, got {spec!r}")


def agent(  # noqa: PLR0917 -- one option per knob
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
    from dynamiccl.agent.config import ConfigError, load  # noqa: PLC0415
    from dynamiccl.agent.coordination import Settings  # noqa: PLC0415
    from dynamiccl.agent.metrics import AgentMetrics  # noqa: PLC0415
    from dynamiccl.agent.runner import Options, Runner  # noqa: PLC0415

    cdir = config_dir or Path(os.environ.get(c.ENV_CONFIG_DIR, "/etc/dynamiccl"))
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
    overrides = {k: v for k, v in overrides.items() if v is not None}
    spec = (
        coordination
        or os.environ.get(c.ENV_COORDINATION)
        or ("kube" if os.environ.get("KUBERNETES_SERVICE_HOST") else "none")
    )
    port = metrics_port
    if port is None:
        port = int(os.environ.get(c.ENV_AGENT_METRICS_PORT, "9465"))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    metrics = AgentMetrics()
    served = metrics.serve(port) if port > 0 and not once else 0

    def emit(doc: dict[str, Any]) -> None:
        if json_out:
            print(json.dumps(doc), flush=True)

    last_error = ""
    while True:
        try:
            cfg = load(cdir, None, **overrides)
            break
        except ConfigError as exc:
            if once:
                raise _fail(f"agent: {exc}") from None
            metrics.config_ok.set(0)
            if str(exc) != last_error:
                log.error("configuration unusable, NCCL keeps its own choices: %s", exc)
                emit({"event": "config_error", "error": str(exc)})
                last_error = str(exc)
            if stop.wait(retry):
                return
    for w in cfg.warnings:
        log.warning("%s", w)
    settings = Settings.for_backend(spec == "kube", step_interval, min_proposal_interval)
    runner = Runner(
        cfg,
        backends=_backends(spec, cfg, kubeconfig),
        metrics=metrics,
        options=Options(
            drain_s=drain_interval,
            flush_s=flush_interval,
            send_grace_s=send_grace,
            coordination=settings,
        ),
    )
    emit(
        {
            "event": "started",
            "pod": cfg.pod_name,
            "shm": str(cfg.shm_path),
            "metrics_port": served,
            "coordination": spec,
            "table": cfg.table.version if cfg.table else None,
            "learned": cfg.learned,
            "warnings": list(cfg.warnings),
        }
    )
    log.info("sidecar for %s/%s pod %s started", cfg.job.namespace, cfg.job.name, cfg.pod_name)
    try:
        if once:
            runner.once()
        else:
            runner.run(stop)
        emit({"event": "stopped", **runner.summary()})
    finally:
        runner.close()

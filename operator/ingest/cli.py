"""`dynamiccl ingest` (also `python -m dynamiccl.operator.ingest.main`): options to settings.

The command's options are read by typer like every other command; the checks
that tie options together (TLS or an explicit --insecure-http, the learning
loop's required volume and image, ServiceAccount user names) are small pure
functions that raise `typer.BadParameter`, so a bad flag is one clear line and
exit code 2.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from dynamiccl import constants as c
from dynamiccl.operator.ingest.auth import SA_USER_PREFIX
from dynamiccl.operator.ingest.ratelimit import DEFAULT_JOB, DEFAULT_POD, Limit
from dynamiccl.operator.ingest.settings import ENV_MODEL_READERS, IngestSettings
from dynamiccl.operator.ingest.writer import DEFAULT_MAX_GROUP
from dynamiccl.operator.learning.loop import LoopConfig

LOOP = "learning loop (status sync, retraining, model rollout)"


def _require_tls(insecure_http: bool, cert: Path | None, key: Path | None) -> None:
    if not insecure_http and (cert is None or key is None):
        raise typer.BadParameter("--tls-cert and --tls-key are required (or --insecure-http)")


def _retention(days: float | None, max_rows: int | None) -> tuple[float | None, int | None]:
    if days is not None and days <= 0:
        raise typer.BadParameter("--retention-days must be > 0")
    if max_rows is not None and max_rows < 0:
        raise typer.BadParameter("--retention-max-rows must be >= 0")
    return (days * 86_400.0 if days else None), max_rows


def _rollup(hours: float | None) -> float | None:
    if hours is not None and hours <= 0:
        raise typer.BadParameter("--rollup-after-hours must be > 0")
    return hours * 3600.0 if hours else None


def _limit(flag: str, rate: float, burst: float) -> Limit | None:
    if rate < 0 or burst < 0:
        raise typer.BadParameter(f"{flag} and {flag}-burst must be >= 0")
    if rate == 0:
        return None
    if burst < 512:
        raise typer.BadParameter(f"{flag}-burst must hold one full batch (512 records)")
    return Limit(rate, burst)


def _pairs(flag: str, labels: list[str]) -> dict[str, str]:
    bad = [kv for kv in labels if "=" not in kv]
    if bad:
        raise typer.BadParameter(f"{flag}: expected KEY=VALUE, got {bad[0]!r}")
    return dict(kv.split("=", 1) for kv in labels)


def _colocate(labels: list[str]) -> dict[str, str] | None:
    return _pairs("--loop-colocate-label", labels) or None


TOLERATION_FIELDS: Final = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


def tolerations(values: list[str]) -> tuple[dict[str, Any], ...]:
    """`--loop-toleration` values: each one Kubernetes toleration as a JSON object."""
    out = []
    for v in values:
        try:
            t = json.loads(v)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--loop-toleration: not JSON: {v!r} ({exc.msg})") from exc
        if not isinstance(t, dict) or not t or not set(t) <= TOLERATION_FIELDS:
            raise typer.BadParameter(
                f"--loop-toleration: expected an object with fields among "
                f"{sorted(TOLERATION_FIELDS)}, got {v!r}"
            )
        out.append(t)
    return tuple(out)


def model_readers(flags: list[str], env: str) -> tuple[str, ...]:
    """The users allowed to fetch model exports: the flags plus a comma-separated env value."""
    readers = {r.strip() for r in [*flags, *env.split(",")] if r.strip()}
    bad = sorted(r for r in readers if not r.startswith(SA_USER_PREFIX))
    if bad:
        raise typer.BadParameter(
            f"--model-reader: expected {SA_USER_PREFIX}<ns>:<name>, got {bad[0]!r}"
        )
    return tuple(sorted(readers))


def _loop(help: str | None = None, **kw: Any) -> Any:
    """An option of the learning loop's help panel."""
    return typer.Option(help=help, rich_help_panel=LOOP, **kw)


def _say(help: str) -> Any:
    """An option with its help line and nothing else."""
    return typer.Option(help=help)


def ingest(  # noqa: PLR0917 - one typer option per parameter
    store: Annotated[
        str,
        typer.Option(
            envvar=c.ENV_STORE_URL,
            help=f"store URL (path, sqlite:///, postgresql://); default ${c.ENV_STORE_URL}, "
            "the way to pass a password (never on the command line)",
        ),
    ],
    host: Annotated[str, typer.Option()] = "0.0.0.0",
    port: Annotated[int, typer.Option()] = 8443,
    tls_cert: Annotated[Path | None, typer.Option()] = None,
    tls_key: Annotated[Path | None, typer.Option()] = None,
    insecure_http: Annotated[
        bool, typer.Option("--insecure-http", help="no TLS (local debugging only)")
    ] = False,
    tls_reload_interval: Annotated[
        float, _say("seconds between checks of the certificate files (reloaded)")
    ] = 30.0,
    kubeconfig: Annotated[Path | None, _say("default: in-cluster credentials")] = None,
    audience: Annotated[str, typer.Option()] = c.INGEST_AUDIENCE,
    max_group: Annotated[int, typer.Option()] = DEFAULT_MAX_GROUP,
    model_reader: Annotated[
        list[str],
        typer.Option(
            metavar="USER",
            help="may GET /v1/models/<version>.npz (system:serviceaccount:<ns>:<operator-sa>); "
            f"repeatable; env {ENV_MODEL_READERS} (comma-separated) adds more",
        ),
    ] = [],  # noqa: B006 - typer reads a list option's default, never mutates it
    rate_pod: Annotated[
        float, _say("records/s one pod may send (token bucket; 0: no limit)")
    ] = DEFAULT_POD.rate,
    rate_pod_burst: Annotated[float, _say("records at once")] = DEFAULT_POD.burst,
    rate_job: Annotated[
        float, _say("records/s all pods of one job may send (0: no limit)")
    ] = DEFAULT_JOB.rate,
    rate_job_burst: Annotated[float, _say("records at once")] = DEFAULT_JOB.burst,
    rate_store: Annotated[
        float,
        _say(
            "records/s this replica stores from all pods together: the store's budget "
            "(0: none; senders told 429 stretch their flush interval)"
        ),
    ] = 0.0,
    retention_days: Annotated[
        float | None, _say("delete experience older than this (hourly pass)")
    ] = None,
    retention_max_rows: Annotated[
        int | None, _say("keep at most this many rows (hourly pass)")
    ] = None,
    rollup_after_hours: Annotated[
        float | None,
        _say(
            "fold experience older than this, already trained on, into one row per job, "
            "cell, configuration and day (hourly pass; training reads the same)"
        ),
    ] = None,
    loop_namespace: Annotated[str, _loop("run the loop; retraining Jobs go here")] = "",
    loop_image: Annotated[str, _loop("image of the retraining Job")] = "",
    loop_pvc: Annotated[str, _loop("PVC holding the store and the models")] = "",
    loop_mount_path: Annotated[str, _loop()] = "/var/lib/dynamiccl",
    loop_store_url: Annotated[str, _loop("store URL as the Job sees it")] = "",
    loop_store_secret: Annotated[
        str, _loop("Secret (key url) the Job reads the store URL from; its spec then carries none")
    ] = "",
    loop_service_account: Annotated[str, _loop()] = "dynamiccl-train",
    loop_colocate_label: Annotated[
        list[str],
        _loop(
            "labels of this pod: the Job runs on its node (SQLite on a RWO volume)",
            metavar="KEY=VALUE",
        ),
    ] = [],  # noqa: B006
    loop_node_selector: Annotated[
        list[str], _loop("node selector of the Job's pod", metavar="KEY=VALUE")
    ] = [],  # noqa: B006
    loop_toleration: Annotated[
        list[str],
        _loop(
            'a toleration of the Job\'s pod, e.g. {"key": "k", "operator": "Exists"}',
            metavar="JSON",
        ),
    ] = [],  # noqa: B006
    loop_cpu: Annotated[str, _loop("the Job's CPU request")] = "2",
    loop_memory: Annotated[str, _loop("the Job's memory request and limit")] = "4Gi",
    loop_interval: Annotated[float, _loop()] = 30.0,
    loop_lease: Annotated[
        str,
        _loop(
            "Lease (in --loop-namespace) electing the one replica that runs the loop; "
            "needed with more than one ingest replica"
        ),
    ] = "",
    loop_identity: Annotated[
        str, _loop("this replica's name in the Lease (default $POD_NAME, else the host name)")
    ] = "",
) -> IngestSettings:
    """Run the reward-ingest endpoint (and, with --loop-namespace, the learning loop)."""
    _require_tls(insecure_http, tls_cert, tls_key)
    max_age_s, max_rows = _retention(retention_days, retention_max_rows)
    loop = None
    if loop_lease and not loop_namespace:
        raise typer.BadParameter("--loop-lease needs --loop-namespace (the loop it elects)")
    if loop_namespace:
        if not loop_image or not loop_pvc:
            raise typer.BadParameter("--loop-namespace needs --loop-image and --loop-pvc")
        loop = LoopConfig(
            namespace=loop_namespace,
            image=loop_image,
            store_url=loop_store_url or store,
            pvc_name=loop_pvc,
            store_url_secret=loop_store_secret or None,
            mount_path=loop_mount_path,
            service_account=loop_service_account,
            colocate_with=_colocate(loop_colocate_label),
            node_selector=_pairs("--loop-node-selector", loop_node_selector),
            tolerations=tolerations(loop_toleration),
            cpu=loop_cpu,
            memory=loop_memory,
        )
    return IngestSettings(
        store_url=store,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_reload_interval_s=tls_reload_interval,
        host=host,
        port=port,
        kubeconfig=kubeconfig,
        audience=audience,
        max_group=max_group,
        loop=loop,
        loop_interval_s=loop_interval,
        loop_lease=loop_lease if loop is not None else "",
        loop_identity=loop_identity or os.environ.get("POD_NAME") or socket.gethostname(),
        rate_pod=_limit("--rate-pod", rate_pod, rate_pod_burst),
        rate_job=_limit("--rate-job", rate_job, rate_job_burst),
        rate_store=_limit("--rate-store", rate_store, max(rate_store * 10, 512.0)),
        retention_max_age_s=max_age_s,
        retention_max_rows=max_rows,
        rollup_after_s=_rollup(rollup_after_hours),
        model_readers=model_readers(model_reader, os.environ.get(ENV_MODEL_READERS, "")),
    )


def parse(argv: list[str] | None) -> IngestSettings:
    """The settings `argv` asks for; a usage error prints one line and exits 2."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(ingest)
    command = typer.main.get_command(app)
    try:
        settings = command.main(args=argv, prog_name="dynamiccl ingest", standalone_mode=False)
    except typer.TyperException as exc:  # typer's usage errors (BadParameter, missing option)
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        raise SystemExit(getattr(exc, "exit_code", 2)) from exc
    if not isinstance(settings, IngestSettings):  # --help: click printed it
        raise SystemExit(settings if isinstance(settings, int) else 0)
    return settings

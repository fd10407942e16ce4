"""`dynamiccl operator` and `dynamiccl inject` (operator issue #4)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

DEFAULT_IMAGE = "ghcr.io/dynamiccl/dynamiccl:0.1.0"


def _fail(message: str) -> None:
    typer.echo(f"dynamiccl: {message}", err=True)
    raise typer.Exit(code=2)


def _load_docs(filename: str) -> list[dict[str, Any]]:
    try:
        text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    except OSError as exc:
        _fail(f"{filename}: cannot read: {exc.strerror}")
    try:
        raw = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        _fail(f"{filename}: not valid YAML: {str(exc).splitlines()[0]}")
    docs: list[dict[str, Any]] = []
    for i, doc in enumerate(raw):
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            docs.extend(d for d in doc["items"] if isinstance(d, dict))
        elif isinstance(doc, dict):
            docs.append(doc)
        else:
            _fail(f"{filename}: document {i}: expected a Kubernetes object (a mapping)")
    if not docs:
        _fail(f"{filename}: no Kubernetes objects found")
    return docs


def inject(  # noqa: PLR0917 - typer maps parameters to options
    filename: Annotated[
        str, typer.Option("--filename", "-f", help="manifest file (YAML/JSON; '-' = stdin)")
    ],
    image: Annotated[
        str | None, typer.Option(help="DynamICCL image (default: $DYNAMICCL_IMAGE)")
    ] = None,
    policy: Annotated[
        Path | None, typer.Option(help="NCCLTuningPolicy YAML whose env knobs to apply")
    ] = None,
    ingest_url: Annotated[str, typer.Option(help="reward ingest URL for the sidecar")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of YAML")] = False,
    namespace_opted_in: Annotated[
        bool,
        typer.Option(
            "--namespace-opted-in",
            help="as if the namespace were labelled dynamiccl.io/tune=true (jobs without the "
            "annotation are then tuned too)",
        ),
    ] = False,
) -> None:
    """Print a manifest mutated exactly as the admission webhook would: only jobs that opted in
    (annotation dynamiccl.io/tune: "true", or --namespace-opted-in) with valid annotations."""
    from pydantic import ValidationError  # noqa: PLC0415

    from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec  # noqa: PLC0415
    from dynamiccl.operator.controller.jobkinds import JobShapeError  # noqa: PLC0415
    from dynamiccl.operator.webhook import inject as inj  # noqa: PLC0415

    spec = None
    if policy is not None:
        pdocs = _load_docs(str(policy))
        try:
            spec = NCCLTuningPolicySpec.model_validate(pdocs[0].get("spec") or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            _fail(f"{policy}: spec.{where}: {first['msg']}")
    settings = inj.Settings(
        image=image or os.environ.get("DYNAMICCL_IMAGE", DEFAULT_IMAGE),
        policy=spec,
        ingest_url=ingest_url,
        namespace_opted_in=namespace_opted_in,
    )
    out: list[dict[str, Any]] = []
    for i, doc in enumerate(_load_docs(filename)):
        try:
            mutated, notes = inj.inject(doc, settings)
        except JobShapeError as exc:
            _fail(f"{filename}: document {i} ({doc.get('kind')}): {exc}")
        for note in notes:
            typer.echo(f"note: {note}", err=True)
        out.append(mutated)
    if as_json:
        typer.echo(json.dumps(out[0] if len(out) == 1 else out, indent=2, sort_keys=False))
    else:
        typer.echo(yaml.safe_dump_all(out, sort_keys=False).rstrip())


def operator(  # noqa: PLR0917 - typer maps parameters to options
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    ] = None,
    namespace: Annotated[
        str, typer.Option(help="namespace the operator runs in (TLS secret, events)")
    ] = "dynamiccl-system",
    webhook_port: Annotated[int, typer.Option(help="HTTPS port of /mutate and /healthz")] = 8443,
    webhook_host: Annotated[str, typer.Option(help="address to bind the webhook on")] = "0.0.0.0",
    metrics_port: Annotated[int, typer.Option(help="plain-HTTP /metrics port (0 = off)")] = 9090,
    tls_dir: Annotated[
        Path | None, typer.Option(help="use tls.crt/tls.key from here (cert-manager mount)")
    ] = None,
    tls_secret: Annotated[
        str, typer.Option(help="self-managed TLS secret name (when --tls-dir is not given)")
    ] = "dynamiccl-webhook-tls",
    webhook_config: Annotated[
        str, typer.Option(help="MutatingWebhookConfiguration whose caBundle we keep current")
    ] = "dynamiccl",
    service: Annotated[str, typer.Option(help="webhook Service name (certificate DNS names)")] = (
        "dynamiccl-webhook"
    ),
    extra_san: Annotated[
        list[str] | None, typer.Option(help="extra certificate SAN (IP or DNS), repeatable")
    ] = None,
    image: Annotated[
        str | None, typer.Option(help="image for injected containers (default $DYNAMICCL_IMAGE)")
    ] = None,
    ingest_url: Annotated[str, typer.Option(help="reward ingest URL given to sidecars")] = "",
    model_token_file: Annotated[
        Path,
        typer.Option(
            help="token the operator shows the ingest to fetch retrained models "
            "(GET /v1/models/<v>.npz); needs the ingest's audience"
        ),
    ] = Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    peering: Annotated[
        str | None, typer.Option(help="kopf peering name for HA (default: standalone)")
    ] = None,
    no_handlers: Annotated[
        bool, typer.Option(help="serve only the webhook (no kopf handlers)")
    ] = False,
    watch_namespace: Annotated[
        list[str] | None,
        typer.Option(help="reconcile jobs only in these namespaces (kopf globs, repeatable)"),
    ] = None,
    cert_check_interval: Annotated[
        float,
        typer.Option(min=0.1, help="seconds between webhook certificate checks (rotate, reload)"),
    ] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="log as JSON lines")] = False,
) -> None:
    """Run the operator (kopf handlers, admission webhook, metrics)."""
    from dynamiccl.operator import run  # noqa: PLC0415

    if watch_namespace and peering is not None:
        _fail(
            "--watch-namespace cannot be combined with --peering: a namespaced kopf operator "
            "elects its leader through KopfPeering objects in every watched namespace, and "
            "the chart ships only the cluster-wide ClusterKopfPeering"
        )

    settings = run.Settings(
        kubeconfig=kubeconfig,
        namespace=namespace,
        webhook_host=webhook_host,
        webhook_port=webhook_port,
        metrics_port=metrics_port,
        tls_dir=tls_dir,
        tls_secret=tls_secret,
        webhook_config=webhook_config,
        service=service,
        extra_sans=tuple(extra_san or ()),
        image=image or os.environ.get("DYNAMICCL_IMAGE", DEFAULT_IMAGE),
        ingest_url=ingest_url,
        model_token_file=model_token_file,
        peering=peering,
        handlers=not no_handlers,
        log_json=as_json,
        watch_namespaces=tuple(watch_namespace or ()),
        cert_check_interval=cert_check_interval,
    )
    try:
        run.main(settings)
    except run.StartupError as exc:
        _fail(str(exc))


def ingest(ctx: typer.Context) -> None:
    """Run the reward-ingest endpoint (`dynamiccl ingest --help` lists its options)."""
    from dynamiccl.operator.ingest.main import main  # noqa: PLC0415 - aiohttp, stores

    raise typer.Exit(code=main(list(ctx.args)))

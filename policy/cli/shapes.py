"""Body of `dynamiccl policy communicators`: every communicator a job's parallelism implies,
how many of each, and whether the job's table covers it (issue 17.2).

Bad input ends with one line naming the option or file and exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, ValidationError

from dynamiccl.api.features import StateFeatures, parse_parallelism
from dynamiccl.api.table import MAX_SCALES, scale_class
from dynamiccl.api.topology import TopologyError, TopologySpec, load_topology
from dynamiccl.policy.cli.learn import _fail, load_job
from dynamiccl.policy.runtime.compile import communicators, parallel_groups, trained_shape
from dynamiccl.policy.runtime.decide import passthrough


class CommunicatorRow(BaseModel):
    """One kind of communicator of the job."""

    group: str
    nranks: int
    nnodes: int
    count: int  # communicators of this kind in the job
    scale_class: int
    status: str  # table | NCCL's own (...)


def job_features(spec: TopologySpec, parallelism: str) -> StateFeatures:
    """A job filling every GPU of `spec`'s nodes, one rank per GPU, with this parallelism."""
    mode, degrees = parse_parallelism(parallelism)
    g, n = spec.gpus_per_node, spec.nodes
    world = g * n
    inner = degrees.tp * degrees.cp * degrees.pp * (degrees.dp if degrees.dp > 1 else 1)
    if world % inner:
        raise ValueError(f"tp·cp·pp·dp = {inner} does not divide the job's {world} ranks")
    same = (g - 1) / (world - 1) if world > 1 else 1.0
    fields = {
        k: v for k, v in spec.model_dump(mode="json").items() if k in TopologySpec.model_fields
    }
    tiers: dict[str, Any] = (
        {"tier_max": "same_rack", "tier_mix": {"same_node": same, "same_rack": 1.0 - same}}
        if n > 1
        else {}
    )
    return StateFeatures.model_validate(
        {
            "world_size": world,
            "gpus_per_pod": g,
            "replicas": n,
            "nproc_per_node": g,
            "topology": {**fields, **tiers},
            "workload": {"parallelism": mode, "degrees": degrees.model_dump()},
        }
    )


def communicator_rows(f: StateFeatures) -> list[CommunicatorRow]:
    """The world, the intra-node communicator the table also carries for multi-node jobs,
    and every group of `parallel_groups`, with its count and coverage."""
    compiled = {c.scale for c in communicators(f)}
    bypass = passthrough(f)
    groups = parallel_groups(f)
    nodes, local = f.topology.nodes, f.nproc_per_node
    if nodes > 1 and local > 1:
        groups.insert(1, ("node", local, 1))
    rows = []
    for name, n, k in groups:
        sc = scale_class(n, k)
        if bypass is not None:
            status = f"NCCL's own (passthrough: {bypass})"
        elif sc in compiled:
            status = "table"
        elif not trained_shape(n, k):
            status = "NCCL's own (beyond the model's training range): tuned online"
        else:
            status = f"NCCL's own (the table is full: {MAX_SCALES} scale classes)"
        count = nodes if name == "node" else f.world_size // n
        rows.append(CommunicatorRow(group=name, nranks=n, nnodes=k, count=count,
                                    scale_class=sc, status=status))  # fmt: skip
    return rows


def _text(f: StateFeatures, rows: list[CommunicatorRow], free: int) -> str:
    d = f.workload.degrees
    deg = " ".join(
        f"{k}={getattr(d, k)}" for k in ("tp", "cp", "pp", "dp", "ep") if getattr(d, k) > 1
    )
    lines = [
        f"job: {f.world_size} ranks on {f.topology.nodes} nodes of {f.nproc_per_node} "
        f"({f.workload.parallelism.value} {deg})".rstrip(),
        f"{'communicator':<13}{'ranks':>7}{'nodes':>7}{'count':>7}{'scale':>7}  status",
    ]
    lines += [
        f"{r.group:<13}{r.nranks:>7}{r.nnodes:>7}{r.count:>7}{r.scale_class:>7}  {r.status}"
        for r in rows
    ]
    lines.append(
        f"any other shape: tuned online by the sidecar ({free} of {MAX_SCALES} scale classes "
        "free in the table)"
        if free
        else "any other shape: NCCL's own choice (no scale class free in the table)"
    )
    return "\n".join(lines)


def communicators_command(
    *, topology: Path, parallelism: str | None, job: Path | None, nodes: int | None, as_json: bool
) -> None:
    """`policy communicators`: the job's communicators and their tables."""
    try:
        spec = load_topology(topology)
        if nodes is not None:
            spec = TopologySpec.model_validate({**spec.model_dump(mode="json"), "nodes": nodes})
    except (TopologyError, ValidationError) as exc:
        _fail(f"--topology/--nodes: {exc}")
    if job is not None:
        got = load_job(topology, job)
        assert isinstance(got, StateFeatures)
        f = got
    elif parallelism is None:
        _fail("give --parallelism (the job's dynamiccl.io/parallelism annotation) or --job")
    else:
        try:
            f = job_features(spec, parallelism)
        except (ValueError, ValidationError) as exc:
            _fail(f"--parallelism {parallelism!r}: {exc}")
    rows = communicator_rows(f)
    free = MAX_SCALES - len({c.scale for c in communicators(f)})
    if as_json:
        doc = {
            "world_size": f.world_size,
            "nodes": f.topology.nodes,
            "degrees": f.workload.degrees.model_dump(),
            "communicators": [r.model_dump() for r in rows],
            "free_scale_classes": free,
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        typer.echo(_text(f, rows, free))

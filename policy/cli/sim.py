"""Bodies of `dynamiccl sim predict` and `dynamiccl sim calibrate` (mounted in `cli.py`).

Bad input ends with one line naming the field and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean, median
from typing import Any

import typer

from dynamiccl.api.nccl import Algo, Collective, Proto
from dynamiccl.api.topology import TopologyError, load_topology
from dynamiccl.policy.sim import calibration
from dynamiccl.policy.sim.calibration_data import load_rows
from dynamiccl.policy.sim.departures import active
from dynamiccl.policy.sim.hardware import HardwareError
from dynamiccl.policy.sim.physics import Harness
from dynamiccl.policy.sim.simulator import Config, InfeasibleConfigError, Simulator


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _enum(kind: type[Algo] | type[Proto] | type[Collective], field: str, value: str) -> Any:
    try:
        return kind(value.strip().lower())
    except ValueError:
        choices = ", ".join(e.value for e in kind)
        _fail(f"{field}: {value!r} is not one of {choices}")


def predict_command(
    *,
    topology: Path,
    collective: str,
    nbytes: int,
    algo: str | None,
    proto: str | None,
    nchannels: int | None,
    chunk: int | None,
    harness: str,
    as_json: bool,
) -> None:
    """`sim predict`: one simulated call, NCCL's pick when no algo/proto is given."""
    coll = _enum(Collective, "collective", collective)
    if nbytes < 0:
        _fail(f"bytes: must be >= 0 (got {nbytes})")
    if nchannels is not None and not 1 <= nchannels <= 64:
        _fail(f"nchannels: must be in 1..64 (got {nchannels})")
    if chunk is not None and chunk <= 0:
        _fail(f"chunk: must be > 0 bytes (got {chunk})")
    h = _enum_harness(harness, Harness)
    a = _enum(Algo, "algo", algo) if algo else None
    p = _enum(Proto, "proto", proto) if proto else None
    try:
        sim = Simulator(load_topology(topology), harness=h)
    except (TopologyError, HardwareError) as exc:
        _fail(str(exc))
    default, _, _ = sim.nccl_default(coll, nbytes)
    config = None
    if a is not None or p is not None or nchannels is not None or chunk is not None:
        pair = sim.nccl.pick_within(coll, nbytes, a, p) if (a is None or p is None) else (a, p)
        if pair is None:
            _fail(f"no available configuration with algo={algo} proto={proto} for {coll.value}")
        assert pair is not None
        config = Config(pair[0], pair[1], nchannels, chunk)
    try:
        pred = sim.predict(coll, nbytes, config)
    except InfeasibleConfigError as exc:
        _fail(str(exc))
    doc = {
        "topology": sim.system.spec.name,
        "collective": coll.value,
        "nbytes": nbytes,
        "time_us": round(pred.time_us, 3),
        "busbw_GBps": round(pred.busbw_GBps, 3),
        "algo": pred.config.algo.value,
        "proto": pred.config.proto.value,
        "nchannels": pred.config.nchannels,
        "chunk_bytes": pred.config.chunk_bytes,
        "harness": h.value,
        "nccl_default": {
            "algo": default.algo.value,
            "proto": default.proto.value,
            "nchannels": default.nchannels,
            "time_us": round(pred.nccl_default_time_us, 3),
            "nccl_estimate_us": round(pred.nccl_estimate_us, 3),
        },
        "speedup_vs_nccl_default": round(pred.nccl_default_time_us / pred.time_us, 4),
        "departures": [d.id for d in active(sim.system, coll)],
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(
        f"{coll.value} {nbytes} B on {doc['topology']}: {pred.config.algo.value}/"
        f"{pred.config.proto.value} x{pred.config.nchannels} channels -> "
        f"{pred.time_us:.1f} us, busbw {pred.busbw_GBps:.2f} GB/s"
    )
    typer.echo(
        f"NCCL default: {default.algo.value}/{default.proto.value} x{default.nchannels} -> "
        f"{pred.nccl_default_time_us:.1f} us (NCCL's own estimate {pred.nccl_estimate_us:.1f} us)"
    )


def _enum_harness(value: str, kind: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        _fail(f"harness: {value!r} is not one of {', '.join(h.value for h in kind)}")


def calibrate_command(*, report: bool, write: bool, as_json: bool) -> None:
    """`sim calibrate`: every row's prediction and error, plus leave-one-system-out."""
    if write:
        calibration.load_params.cache_clear()
        calibration.write_params()
        calibration.load_params.cache_clear()
    params = calibration.load_params()
    preds = calibration.predict(params, load_rows())
    errors = [abs(p.error_pct) for p in preds]
    result = calibration.loso() if report else None
    by_machine = calibration.loso(by_machine=True) if report else None
    doc: dict[str, Any] = {
        "params": params.model_dump(),
        "in_sample": {"median_abs_error_pct": median(errors), "mean_abs_error_pct": mean(errors)},
        "rows": [
            {
                "id": p.row.id,
                "system": p.row.system,
                "collective": p.row.collective.value,
                "nbytes": p.row.nbytes,
                "config": f"{p.algo.value}/{p.proto.value}/{p.nchannels}",
                "measured_us": round(p.measured_us, 3),
                "predicted_us": round(p.predicted_us, 3),
                "error_pct": round(p.error_pct, 2),
                "source": p.row.source,
            }
            for p in preds
        ],
    }
    if result is not None and by_machine is not None:
        doc["loso"] = result.model_dump()
        doc["leave_one_machine_out"] = by_machine.model_dump()
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(render_table(doc))


def render_table(doc: dict[str, Any]) -> str:
    """The human report (also pasted into docs/simulator.md)."""
    lines = [
        "| id | system | collective | nbytes | NCCL config | measured us | predicted us "
        "| error % |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['id']} | {r['system']} | {r['collective']} | {r['nbytes']} | {r['config']} "
            f"| {r['measured_us']:.1f} | {r['predicted_us']:.1f} | {r['error_pct']:+.1f} |"
        )
    ins = doc["in_sample"]
    lines.append("")
    lines.append(
        f"In-sample |error|: median {ins['median_abs_error_pct']:.1f} %, "
        f"mean {ins['mean_abs_error_pct']:.1f} % over {len(doc['rows'])} rows"
    )
    for key, title in (
        ("loso", "Leave-one-system-out"),
        ("leave_one_machine_out", "Leave-one-machine-out"),
    ):
        loso = doc.get(key)
        if not loso:
            continue
        lines.append("")
        lines.append("| left out | rows | median abs error % | mean abs error % |")
        lines.append("|---|---:|---:|---:|")
        for name, v in loso["per_system"].items():
            lines.append(f"| {name} | {int(v['rows'])} | {v['median']:.1f} | {v['mean']:.1f} |")
        lines.append("")
        lines.append(
            f"{title} |error|: median {loso['median_abs_error_pct']:.1f} %, "
            f"mean {loso['mean_abs_error_pct']:.1f} %"
        )
    return "\n".join(lines)

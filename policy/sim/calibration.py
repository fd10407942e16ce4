"""Fit the simulator's parameters to the published measurements; leave-one-system-out.

The objective is the mean squared log-ratio of predicted to measured time over
the rows, plus a weak pull towards the starting values (so directions no row
informs stay put). A parameter whose scope has no training row at all (say the
EFA ones when the EFA system is left out) is not fitted: it takes its fallback
(the IB value, or "no departure"), which is exactly what leave-one-system-out
must test: how the simulator does on a system it has never seen.

`dynamiccl sim calibrate --report` prints every row and the LOSO summary;
`write_params()` regenerates `data/sim_params.json` (a unit test checks drift).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from statistics import mean, median
from typing import Final

import numpy as np
from pydantic import BaseModel, ConfigDict

from dynamiccl.api.nccl import Algo, Proto
from dynamiccl.api.topology import Fabric
from dynamiccl.policy.sim.calibration_data import CalibrationRow, calibration_system, load_rows
from dynamiccl.policy.sim.fit import from_box, nelder_mead, to_box
from dynamiccl.policy.sim.nccl_model import NcclModel
from dynamiccl.policy.sim.physics import Harness, Physics, SimParams, launch_for
from dynamiccl.policy.sim.system import System

PARAMS_FILE: Final = "data/sim_params.json"
LAUNCH_FIELD: Final = {
    Harness.NCCL_TESTS: "launch_host_us",
    Harness.NCCL_TESTS_GRAPH: "launch_graph_us",
    Harness.TORCH: "launch_torch_us",
}
REGULARISATION: Final = 1e-3

Scope = Callable[[CalibrationRow, System], bool]


def _multi(fabric_efa: bool) -> Scope:
    def scope(_: CalibrationRow, s: System) -> bool:
        return s.nodes > 1 and (s.fabric is Fabric.EFA) == fabric_efa

    return scope


def _harness(h: Harness) -> Scope:
    return lambda row, _: row.harness is h


def _all(_: CalibrationRow, __: System) -> bool:
    return True


def _nvls(_: CalibrationRow, s: System) -> bool:
    return bool(s.spec.nvls)


def _nvlink(_: CalibrationRow, s: System) -> bool:
    return s.nvlink


@dataclass(frozen=True)
class ParamSpec:
    """Bounds, scope (which rows inform it) and fallback of one parameter."""

    lo: float
    hi: float
    scope: Scope
    fallback: str | float | None = None  # another parameter's value, a constant, or keep


SPECS: Final[dict[str, ParamSpec]] = {
    "launch_graph_us": ParamSpec(0.0, 30.0, _harness(Harness.NCCL_TESTS_GRAPH)),
    "launch_host_us": ParamSpec(0.0, 60.0, _harness(Harness.NCCL_TESTS)),
    "launch_torch_us": ParamSpec(0.0, 80.0, _harness(Harness.TORCH), "launch_host_us"),
    "k_lat_intra": ParamSpec(0.2, 5.0, _all),
    "k_lat_net_ib": ParamSpec(0.2, 10.0, _multi(False)),
    "k_lat_net_efa": ParamSpec(0.2, 10.0, _multi(True), "k_lat_net_ib"),
    "eta_nvlink": ParamSpec(0.3, 1.0, _nvlink),
    "eta_net_ib": ParamSpec(0.3, 1.0, _multi(False)),
    "eta_net_efa": ParamSpec(0.3, 1.0, _multi(True), "eta_net_ib"),
    "nvls_eta_inf": ParamSpec(0.3, 1.2, _nvls),
    "nvls_c": ParamSpec(0.0, 2.0, _nvls),
    "cap_ll_GBps": ParamSpec(0.5, 40.0, _all),
    "k_chunk_bytes": ParamSpec(0.0, 65536.0, _all),
    "nvls_fill": ParamSpec(0.0, 100.0, _nvls),
    "efa_ll_factor": ParamSpec(0.01, 1.0, _multi(True), 1.0),
}


@dataclass(frozen=True)
class Prediction:
    """One row: measured vs simulated."""

    row: CalibrationRow
    algo: Algo
    proto: Proto
    nchannels: int
    measured_us: float
    predicted_us: float

    @property
    def error_pct(self) -> float:
        """Signed relative error of the prediction, percent."""
        return 100.0 * (self.predicted_us / self.measured_us - 1.0)


@cache
def _model(system_name: str) -> NcclModel:
    return NcclModel(calibration_system(system_name))


@cache
def row_config(row: CalibrationRow) -> tuple[int, int, int]:
    """(algo, proto, nchannels) the measured run used: NCCL's pick under the row's constraints."""
    model = _model(row.system)
    pair = model.pick_within(
        row.collective,
        row.nbytes,
        None if row.algo == "default" else row.algo,
        None if row.proto == "default" else row.proto,
    )
    if pair is None:
        raise ValueError(f"row {row.id}: {row.algo}/{row.proto} is unavailable on {row.system}")
    a, p = pair[0].nccl_id, pair[1].nccl_id
    nch = int(model.channels(np.array([a]), np.array([p]), np.array([row.nbytes]))[0])
    return a, p, nch


def predict(params: SimParams, rows: Sequence[CalibrationRow]) -> list[Prediction]:
    """Simulated time of every row under `params` (raw physics: rows are NCCL's picks)."""
    by_system: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_system.setdefault(row.system, []).append(i)
    out: list[Prediction | None] = [None] * len(rows)
    for name, idx in by_system.items():
        ph = Physics(_model(name), params)
        sub = [rows[i] for i in idx]
        cfg = np.array([row_config(r) for r in sub], dtype=np.int64)
        times = ph.times(
            [r.collective.nccl_id for r in sub],
            [r.nbytes for r in sub],
            cfg[:, 0],
            cfg[:, 1],
            cfg[:, 2],
            launch_us=np.array([launch_for(r.harness, params) for r in sub]),
        )
        for j, (i, row) in enumerate(zip(idx, sub, strict=True)):
            out[i] = Prediction(
                row=row,
                algo=list(Algo)[int(cfg[j, 0])],
                proto=list(Proto)[int(cfg[j, 1])],
                nchannels=int(cfg[j, 2]),
                measured_us=row.measured_time_us(ph.system.ranks),
                predicted_us=float(times[j]),
            )
    return [p for p in out if p is not None]


def _free(rows: Sequence[CalibrationRow]) -> list[str]:
    """Parameters at least one training row informs."""
    return [
        name
        for name, spec in SPECS.items()
        if any(spec.scope(r, calibration_system(r.system)) for r in rows)
    ]


def _resolve(values: dict[str, float], free: Sequence[str]) -> SimParams:
    """Apply fallbacks to the parameters nothing informed."""
    out = dict(values)
    for name, spec in SPECS.items():
        if name in free or spec.fallback is None:
            continue
        out[name] = out[spec.fallback] if isinstance(spec.fallback, str) else spec.fallback
    return SimParams(**out)


@dataclass(frozen=True)
class _Batch:
    """One system's rows as arrays (what the objective evaluates repeatedly)."""

    model: NcclModel
    coll: np.ndarray
    nbytes: np.ndarray
    cfg: np.ndarray  # (n, 3): algo, proto, nchannels
    chunk: np.ndarray  # NCCL's default chunk of each row (parameter-independent)
    launch: tuple[str, ...]  # SimParams field holding each row's launch overhead
    measured: np.ndarray


def _batches(rows: Sequence[CalibrationRow]) -> list[_Batch]:
    by_system: dict[str, list[CalibrationRow]] = {}
    for row in rows:
        by_system.setdefault(row.system, []).append(row)
    out = []
    for name, sub in by_system.items():
        model = _model(name)
        cfg = np.array([row_config(r) for r in sub], dtype=np.int64)
        nbytes = np.array([float(r.nbytes) for r in sub])
        chunk = Physics(model, SimParams()).default_chunk(cfg[:, 0], nbytes, cfg[:, 2])
        out.append(
            _Batch(
                model=model,
                coll=np.array([r.collective.nccl_id for r in sub]),
                nbytes=nbytes,
                cfg=cfg,
                chunk=chunk,
                launch=tuple(LAUNCH_FIELD[r.harness] for r in sub),
                measured=np.array([r.measured_time_us(model.system.ranks) for r in sub]),
            )
        )
    return out


def _log_errors(params: SimParams, batches: Sequence[_Batch]) -> np.ndarray:
    parts = []
    for b in batches:
        launch = np.array([getattr(params, f) for f in b.launch])
        t = Physics(b.model, params).times(
            b.coll, b.nbytes, b.cfg[:, 0], b.cfg[:, 1], b.cfg[:, 2], chunk=b.chunk, launch_us=launch
        )
        parts.append(np.log(t / b.measured))
    return np.concatenate(parts)


def fit(rows: Sequence[CalibrationRow], start: SimParams | None = None) -> SimParams:
    """Least squares in log-time over `rows`; deterministic."""
    init = (start or SimParams()).model_dump()
    free = _free(rows)
    lo = np.array([SPECS[n].lo for n in free])
    hi = np.array([SPECS[n].hi for n in free])
    u0 = from_box(np.array([init[n] for n in free]), lo, hi)
    batches = _batches(rows)

    def params_at(u: np.ndarray) -> SimParams:
        values = dict(init)
        values.update(zip(free, to_box(u, lo, hi).tolist(), strict=True))
        return _resolve(values, free)

    def objective(u: np.ndarray) -> float:
        logs = _log_errors(params_at(u), batches)
        return float(np.mean(np.square(logs))) + REGULARISATION * float(np.sum((u - u0) ** 2))

    u, _ = nelder_mead(objective, u0.tolist())
    return params_at(u)


class LosoResult(BaseModel):
    """Leave-one-system-out errors (absolute, percent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_system: dict[str, dict[str, float]]  # system -> median / mean abs error, rows
    median_abs_error_pct: float
    mean_abs_error_pct: float
    rows: list[dict[str, float | str]]


def machine_of(system_name: str) -> str:
    """The physical machine a calibration system runs on.

    dgx-h200-4gpu .. dgx-h200-7gpu are the same 8x H200 node with fewer GPUs
    engaged: leaving one of them out still trains on its siblings, so the
    stricter leave-one-machine-out groups them.
    """
    key = _machine_key(system_name)
    names = sorted(n for n in {r.system for r in load_rows()} if _machine_key(n) == key)
    return names[0] if len(names) == 1 else "+".join(names)


def _machine_key(name: str) -> tuple[object, ...]:
    s = calibration_system(name).spec
    return (s.gpu, s.intra, s.nvlink_GBps, s.nodes, s.fabric, s.nics_per_node, s.nic_Gbps)


def loso(rows: Sequence[CalibrationRow] | None = None, *, by_machine: bool = False) -> LosoResult:
    """Refit without each system (or machine) in turn and predict its rows."""
    rows = list(rows or load_rows())
    group = machine_of if by_machine else (lambda name: name)
    groups = sorted({group(r.system) for r in rows})
    all_errors: list[float] = []
    per: dict[str, dict[str, float]] = {}
    detail: list[dict[str, float | str]] = []
    for name in groups:
        train = [r for r in rows if group(r.system) != name]
        test = [r for r in rows if group(r.system) == name]
        params = fit(train)
        errs = []
        for p in predict(params, test):
            errs.append(abs(p.error_pct))
            detail.append({"id": p.row.id, "left_out": name, "error_pct": round(p.error_pct, 2)})
        per[name] = {"median": median(errs), "mean": mean(errs), "rows": float(len(errs))}
        all_errors.extend(errs)
    return LosoResult(
        per_system=per,
        median_abs_error_pct=median(all_errors),
        mean_abs_error_pct=mean(all_errors),
        rows=detail,
    )


def data_digest() -> str:
    """Hash of the calibration data the stored parameters were fitted on."""
    files = importlib.resources.files("dynamiccl.policy").joinpath("data/calibration")
    h = hashlib.sha256(files.joinpath("measurements.csv").read_bytes())
    for entry in sorted(files.joinpath("systems").iterdir(), key=lambda e: e.name):
        h.update(entry.read_bytes())
    return h.hexdigest()[:16]


@cache
def load_params() -> SimParams:
    """The committed, fitted parameters (`data/sim_params.json`)."""
    text = importlib.resources.files("dynamiccl.policy").joinpath(PARAMS_FILE).read_text()
    return SimParams.model_validate(json.loads(text)["params"])


def write_params(path: Path | None = None) -> SimParams:
    """Refit on every row and write the parameters JSON (the committed default)."""
    params = fit(load_rows())
    target = path or Path(str(importlib.resources.files("dynamiccl.policy").joinpath(PARAMS_FILE)))
    doc = {
        "generated_by": "dynamiccl sim calibrate --write",
        "data_digest": data_digest(),
        "params": {k: round(v, 6) for k, v in params.model_dump().items()},
    }
    target.write_text(json.dumps(doc, indent=2) + "\n")
    return params


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    import sys

    if "--write" in sys.argv:
        print(write_params().model_dump_json(indent=2))

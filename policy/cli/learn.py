"""Bodies of `policy decide`, `bench tune`, `bench suite` and `train` (mounted in `cli.py`).

Bad input ends with one line naming the file or field and exit code 2, never a
traceback.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, NoReturn

import typer
import yaml
from pydantic import ValidationError

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.nccl import Collective
from dynamiccl.api.topology import TopologyError, TopologySpec, load_topology
from dynamiccl.api.tuning_policy import NCCLTuningPolicySpec
from dynamiccl.policy.runtime.model_file import ModelError
from dynamiccl.policy.runtime.ranker import Ranker, load_ranker
from dynamiccl.policy.sim.hardware import HardwareError


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _load_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        _fail(f"{what} {path}: cannot read: {exc.strerror}")
    except yaml.YAMLError as exc:
        _fail(f"{what} {path}: not valid YAML/JSON: {exc}")


def _validation(path: Path, exc: ValidationError) -> NoReturn:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(document)"
    _fail(f"{path}: {where}: {first['msg']}")


def load_job(topology: Path, job: Path | None) -> TopologySpec | StateFeatures:
    """The topology spec, or the job's state features with the spec's topology fields."""
    try:
        spec = load_topology(topology)
    except TopologyError as exc:
        _fail(str(exc))
    if job is None:
        return spec
    data = _load_yaml(job, "job")
    if not isinstance(data, dict):
        _fail(f"{job}: expected a mapping of state features")
    topo = {**(data.get("topology") or {}), **spec.model_dump(mode="json")}
    topo = {k: v for k, v in topo.items() if k not in (spec.model_extra or {})}
    try:
        return StateFeatures.model_validate({**data, "topology": topo})
    except ValidationError as exc:
        _validation(job, exc)


def load_policy_spec(path: Path | None) -> NCCLTuningPolicySpec:
    """An NCCLTuningPolicy `spec` (or a whole object with a `spec` key) from YAML."""
    if path is None:
        return NCCLTuningPolicySpec()
    data = _load_yaml(path, "policy")
    if isinstance(data, dict) and "spec" in data:
        data = data["spec"]
    try:
        return NCCLTuningPolicySpec.model_validate(data or {})
    except ValidationError as exc:
        _validation(path, exc)


def load_model(path: Path | None) -> Ranker:
    """The model for decisions: the exported `.npz` when there is one (no torch), else torch."""
    try:
        return load_ranker(path)
    except ModelError as exc:
        _fail(str(exc))


def _collective(value: str) -> Collective:
    try:
        return Collective(value.strip().lower())
    except ValueError:
        _fail(f"collective: {value!r} is not one of {', '.join(c.value for c in Collective)}")


def _emit(doc: dict[str, Any], as_json: bool, text: str) -> None:
    typer.echo(json.dumps(doc, indent=2) if as_json else text)


def decide_command(
    *,
    topology: Path,
    job: Path | None,
    collective: str,
    nbytes: int,
    policy_file: Path | None,
    model: Path | None,
    as_json: bool,
) -> None:
    """`policy decide`: the learned configuration for one call."""
    from dynamiccl.policy.runtime.decide import Decider  # noqa: PLC0415 - torch stays lazy
    from dynamiccl.policy.runtime.space import ActionLimits  # noqa: PLC0415

    coll = _collective(collective)
    if nbytes < 0:
        _fail(f"bytes: must be >= 0 (got {nbytes})")
    target = load_job(topology, job)
    limits = ActionLimits.from_policy(load_policy_spec(policy_file))
    pol = load_model(model)
    try:
        decision = Decider.of(pol, target, limits).decide(coll, nbytes)
    except (HardwareError, TopologyError, ValueError) as exc:
        _fail(str(exc))
    doc = decision.model_dump(mode="json")
    doc["model"] = str(model) if model else "default"
    text = (
        f"{coll.value} {nbytes} B: {decision.algo.value}/{decision.proto.value} "
        f"nchannels={decision.nchannels or 'NCCL'} chunk={decision.chunk_bytes or 'NCCL'} "
        f"(NCCL: {decision.nccl_default.algo.value}/{decision.nccl_default.proto.value})"
    )
    _emit(doc, as_json, text + (f" passthrough: {decision.reason}" if decision.passthrough else ""))


def tune_command(
    *,
    surface: Path,
    topology: Path,
    budget: int,
    seed: int,
    max_candidates: int,
    model: Path | None,
    as_json: bool,
    peers: bool = False,
) -> None:
    """`bench tune`: online tuning against a response surface (`--peers`: side by side
    with NCCL's default, coordinate descent, UCB, uniform and the static policy)."""
    from dynamiccl.policy.eval.bench_tune import surface_arms, tune_surface  # noqa: PLC0415
    from dynamiccl.policy.eval.decider_views import (  # noqa: PLC0415
        nccl_estimate,
        nccl_pick,
        policy_prior,
    )
    from dynamiccl.policy.runtime.decide import Decider  # noqa: PLC0415
    from dynamiccl.policy.sim.surface import SurfaceError, parse_surface  # noqa: PLC0415

    if budget < 1:
        _fail(f"budget: must be >= 1 (got {budget})")
    if not 1 <= max_candidates <= 64:
        _fail(f"max-candidates: must be in 1..64 (got {max_candidates})")
    try:
        text = surface.read_text()
    except OSError as exc:
        _fail(f"surface {surface}: cannot read: {exc.strerror}")
    try:
        parsed = parse_surface(text, source=str(surface))
    except SurfaceError as exc:
        _fail(str(exc))
    spec = load_job(topology, None)
    pol = load_model(model)
    try:
        decider = Decider.of(pol, spec)
        report = tune_surface(
            surface_arms(parsed),
            policy_prior(decider),
            nccl_pick(decider),
            budget=budget,
            seed=seed,
            max_candidates=max_candidates,
            nranks=decider.ctx.system.ranks,
            nnodes=decider.ctx.system.nodes,
        )
    except (HardwareError, ValueError) as exc:
        _fail(str(exc))
    doc = report.model_dump(mode="json")
    lines = [
        f"{b.collective.value:>13} {b.nbytes:>12} regret {b.regret * 100:6.2f} %  "
        f"chosen {b.chosen.algo.value}/{b.chosen.proto.value}/{b.chosen.nchannels or '-'}  "
        f"best {b.best.algo.value}/{b.best.proto.value}/{b.best.nchannels or '-'}"
        for b in report.buckets
    ]
    lines.append(
        f"mean regret {report.mean_regret * 100:.2f} %, max {report.max_regret * 100:.2f} %, "
        f"{report.within_3pct * 100:.0f} % of buckets within 3 % ({budget} calls per bucket); "
        f"exploration cost {report.mean_exploration_cost * 100:.2f} % (mean time of all calls "
        "over the best)"
    )
    if peers:
        from dynamiccl.policy.eval.peer_bench import peer_table, render, run_peers  # noqa: PLC0415

        raw = run_peers(
            surface_arms(parsed),
            policy_prior(decider),
            nccl_pick(decider),
            budget=budget,
            seed=seed,
            nranks=decider.ctx.system.ranks,
            nnodes=decider.ctx.system.nodes,
            max_candidates=max_candidates,
            estimate=nccl_estimate(decider),
        )
        table = peer_table(raw, budget, [seed])
        doc["peers"] = table.model_dump(mode="json")
        lines.append(render(table, f"side by side ({budget} calls per bucket, seed {seed}):"))
    _emit(doc, as_json, "\n".join(lines))


def suite_command(*, out: Path | None, model: Path | None, budget: int, as_json: bool) -> None:
    """`bench suite`: speedup vs NCCL's default and fraction of the oracle."""
    from dynamiccl.policy.eval.suite import render, run_suite  # noqa: PLC0415

    if budget < 0:
        _fail(f"budget: must be >= 0 (got {budget})")
    if out is not None and importlib.util.find_spec("matplotlib") is None:
        _fail(
            "--out: matplotlib is not installed; it draws the plots. Install the plots "
            "extra (pip install 'dynamiccl[plots]') or leave --out out."
        )
    pol = load_model(model)
    report = run_suite(pol, budget=budget)
    if out is not None:
        try:
            render(report, out)
        except OSError as exc:
            _fail(f"out {out}: cannot write plots: {exc.strerror}")
    _emit(report.model_dump(mode="json"), as_json, report.summary())


def train_command(
    *,
    config: Path | None,
    from_store: str | None,
    features: Path | None,
    out: Path,
    version: str | None,
    parent: str | None,
    as_json: bool,
) -> None:
    """`train`: the curriculum (and offline experience), written to OUT."""
    if importlib.util.find_spec("torch") is None:
        _fail(
            "train: torch is not installed. Install the training extra "
            "(pip install 'dynamiccl[train]') or run the trainer image "
            "(docker build --target trainer; the chart's learning.image)."
        )
    from dynamiccl.policy.train.train import ConfigError, TrainConfig, load_config  # noqa: PLC0415
    from dynamiccl.policy.train.train_job import TrainJobError, train_job  # noqa: PLC0415

    try:
        cfg = load_config(config) if config else TrainConfig()
    except ConfigError as exc:
        _fail(str(exc))
    try:
        manifest = train_job(
            cfg,
            out=out,
            from_store=from_store,
            features_file=features,
            version=version,
            parent=parent,
            log=(lambda _line: None) if as_json else typer.echo,
        )
    except TrainJobError as exc:
        _fail(str(exc))
    _emit(manifest, as_json, f"wrote {out / 'model.pt'}; metrics in {out / 'metrics.json'}")

"""The decision table a job starts with: compiled from a model, cached, fitted to its ConfigMap.

The table comes from the policy package's compile-to-table when it exists
(``initial_table``); until then, and in ``observe`` mode or when the features say
passthrough, it is an empty table: every cell is "NCCL's own choice", with the reason.
A `Compiler` other than the shipped model's (operator/controller/model_fetch.py) is
passed in by whoever knows where model versions live.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.learning import ClassCoverage
from dynamiccl.api.table import DecisionTable
from dynamiccl.api.tuning_policy import Mode, NCCLTuningPolicySpec
from dynamiccl.api.tuning_run import Arm

log = logging.getLogger("dynamiccl.operator.controller.job_table")
TABLE_FORMAT: Final = "dynamiccl.table/v1"
# the table's share of the job's ConfigMap (1 MiB in all): room for the features, the
# exploration settings, the job's identity, the env knobs and the ingest CA
MAX_TABLE_JSON: Final = 768 * 1024


def canonical_json(value: Any) -> str:
    """Stable JSON (sorted keys, no spaces): equal content ⇒ equal text ⇒ equal digest."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical_json(value).encode()).hexdigest()


# (features, policy spec, model version) -> the compiled table (a DecisionTable or its JSON),
# or None when this compiler has no model for that version.
Compiler = Callable[[StateFeatures, NCCLTuningPolicySpec, str], Any]
SHIPPED_MODEL_VERSION: Final = "default"


class ModelUnavailable(Exception):  # noqa: N818 - an outcome: the job gets NCCL's choice
    """A compiler cannot get the model version now (fetch failed, unknown version, bad file).

    The job gets the empty table with reason ``no-model:<version>: <message>``;
    a later reconcile retries.
    """


@dataclass(frozen=True)
class _LoadFailure:
    message: str


@lru_cache(maxsize=1)
def _shipped_policy() -> Any | None:
    """The policy package's shipped model, loaded once (None if the package has none).

    It is the numpy export (``default.npz``) run by the torch-free
    ``NumpyPolicy``: compiling tables never imports torch (~0.5 GiB RSS).
    A model that fails to load is remembered as a ``_LoadFailure`` (not retried per
    job: the image ships the file, a retry cannot fix it).
    """
    try:
        numpy_policy = importlib.import_module("dynamiccl.policy.runtime.numpy_policy")
    except ImportError:
        return None
    if not numpy_policy.DEFAULT_NPZ.exists():
        return None
    try:
        return numpy_policy.NumpyPolicy.load(numpy_policy.DEFAULT_NPZ)
    except Exception as exc:
        return _LoadFailure(f"{type(exc).__name__}: {exc}")


def warm_up() -> str:
    """Import the compiler and load the shipped model now (at start-up), not on the first job.

    The first job would otherwise pay for importing the compiler and loading the
    model while the training operator is already creating its pods. Returns what is loaded.
    """
    if _compiler() is None:
        return "no compiler: initial tables are NCCL's choice"
    model = _shipped_policy()
    if isinstance(model, _LoadFailure):
        return f"shipped model unusable ({model.message}): initial tables are NCCL's choice"
    return "no shipped model" if model is None else "compiler and shipped model loaded"


def shipped_compiler() -> Compiler | None:
    """The compiler for the shipped model only (None without the policy package)."""
    return _compiler()


@lru_cache(maxsize=1)
def _compiler() -> Compiler | None:
    """The policy package's compile-to-table with its shipped model, if both have landed.

    It compiles for the shipped model version only; other versions need their
    model file, so whoever knows where versions live (the model registry) passes
    its own `Compiler` to `initial_table` / `build`.
    """
    try:
        module = importlib.import_module("dynamiccl.policy.runtime.compile")
    except ImportError:
        return None
    compile_table = getattr(module, "compile_table", None)
    if compile_table is None:
        return None

    def compile_shipped(
        features: StateFeatures, policy: NCCLTuningPolicySpec, model_version: str
    ) -> Any:
        if model_version != SHIPPED_MODEL_VERSION:
            return None
        model = _shipped_policy()
        if isinstance(model, _LoadFailure):
            raise RuntimeError(model.message)
        return None if model is None else compile_table(model, features, policy)

    return compile_shipped


# Compiled tables by compiler, keyed by (model version, features, policy spec): a job is
# reconciled on every event of it and of its pods, and most jobs of a cluster share their
# features; compiling (model inference) is the bulk of a reconcile's CPU.
TABLE_CACHE_SIZE: Final = 256
_TABLES: weakref.WeakKeyDictionary[Compiler, OrderedDict[str, str]] = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def _compile_cached(
    compile_table: Compiler,
    features: StateFeatures,
    policy: NCCLTuningPolicySpec,
    model_version: str,
) -> Any:
    """``compile_table(...)``, memoised per compiler (LRU); only tables are remembered."""
    key = digest([model_version, features.model_dump(mode="json"), policy.model_dump(mode="json")])
    with _TABLES_LOCK:
        tables = _TABLES.setdefault(compile_table, OrderedDict())
        if key in tables:
            tables.move_to_end(key)
            return json.loads(tables[key])
    table = compile_table(features, policy, model_version)
    dumped = table.model_dump(mode="json") if hasattr(table, "model_dump") else table
    if isinstance(dumped, dict):
        with _TABLES_LOCK:
            tables[key] = canonical_json(dumped)
            while len(tables) > TABLE_CACHE_SIZE:
                tables.popitem(last=False)
    return dumped


def initial_table(
    features: StateFeatures,
    policy: NCCLTuningPolicySpec,
    model_version: str,
    compiler: Compiler | None = None,
    *,
    coverage: ClassCoverage | None = None,
    job_uid: str = "",
) -> dict[str, Any]:
    """The decision table a job starts with.

    ``static``/``learned`` with a compiler that has the model version: the
    compiled table. Otherwise (``observe``, passthrough features, no compiler
    or no model for the version): an empty table, i.e. NCCL's own choice in
    every cell, with the reason.
    """
    compile_table = compiler or _compiler()
    tunes = policy.mode in (Mode.STATIC, Mode.LEARNED) and not features.topology.passthrough
    failed = ""
    if compile_table is not None and tunes:
        try:
            table = _compile_cached(compile_table, features, policy, model_version)
        except ModelUnavailable as exc:
            failed = f"no-model:{model_version}: {exc}"[:240]
            table = None
        except Exception as exc:  # a broken model never breaks the job: NCCL decides
            log.warning("compiling the initial table failed (NCCL's choice): %s", exc)
            failed = f"compile-error: {type(exc).__name__}: {exc}"[:240]
            table = None
        dumped = table.model_dump(mode="json") if hasattr(table, "model_dump") else table
        if isinstance(dumped, dict):
            return fit_table(_with_assignment(dumped, policy, coverage, job_uid))
    reason = "passthrough" if features.topology.passthrough else policy.mode.value
    if tunes:
        reason = "no-compiler" if compile_table is None else f"no-model:{model_version}"
        reason = failed or reason
    return {
        "format": TABLE_FORMAT,
        "version": 1,
        "model_version": model_version,
        "cells": [],
        "default": "nccl",
        "reason": reason,
    }


@dataclass(frozen=True)
class Compiled:
    """A job's compiled table and what its record says of it: the cells that came from the
    class's findings (`measured_cells`) and, for a canary job, the promoted version its table
    was compared with and the cells where it explores that version's choice (`arms`)."""

    table: dict[str, Any]
    measured: tuple[str, ...] = ()
    arms_baseline: str = ""
    arms: tuple[Arm, ...] = ()


def compile_job(
    features: StateFeatures,
    policy: NCCLTuningPolicySpec,
    model_version: str,
    compiler: Compiler | None = None,
    *,
    coverage: ClassCoverage | None = None,
    job_uid: str = "",
    baseline_version: str | None = None,
) -> Compiled:
    """`initial_table` and its cells from measurements; given `baseline_version` (a canary
    job's promoted version), the baseline's table compiled the same way and, where the two
    choose otherwise, its choice explored too (policy/runtime/arms.py)."""
    table = initial_table(
        features, policy, model_version, compiler, coverage=coverage, job_uid=job_uid
    )
    measured = tuple(measured_cells(table, coverage)) if policy.mode is Mode.LEARNED else ()
    if (
        policy.mode is not Mode.LEARNED
        or not baseline_version
        or baseline_version == model_version
        or not table.get("cells")
        or "format" in table
    ):
        return Compiled(table, measured)
    base = initial_table(
        features, policy, baseline_version, compiler, coverage=coverage, job_uid=job_uid
    )
    if not base.get("cells") or "format" in base:  # the baseline's table could not be had
        return Compiled(table, measured)
    try:
        arms_module = importlib.import_module("dynamiccl.policy.runtime.arms")
        both, arms = arms_module.add_arms(
            DecisionTable.model_validate(table),
            DecisionTable.model_validate(base),
            arms_module.nccl_picker(features, coverage),
        )
    except ImportError:
        return Compiled(table, measured)
    fitted = fit_table(both.model_dump(mode="json"))
    held = {(c.get("collective"), c.get("bucket"), c.get("scale")) for c in fitted["cells"]}
    kept = tuple(a for a in arms if (a.collective, a.size_bucket, a.scale) in held)
    # the arms' candidates can push the table over its size: what fit_table kept is its record
    measured = tuple(measured_cells(fitted, coverage))
    return Compiled(fitted, measured, baseline_version if kept else "", kept)


def fit_table(table: dict[str, Any], limit: int = MAX_TABLE_JSON) -> dict[str, Any]:
    """`table` without its last scale classes until its JSON fits `limit` bytes.

    A table of 8 scale classes whose every cell holds 4 choices and 4 candidates is
    1.05 MiB of JSON, more than a ConfigMap holds; compiled tables are about 400 bytes
    per cell (0.5 MiB for 8 scale classes). The scale classes go last-compiled first
    (the world and the node come first); the sidecar tunes their communicators online.
    """
    scales = list(table.get("scales") or [])
    while len(scales) > 1 and len(canonical_json(table)) > limit:
        gone = scales.pop()
        cells = [c for c in table.get("cells") or [] if c.get("scale") != gone]
        table = {**table, "scales": scales, "cells": cells}
        log.warning("the job's table is over %d bytes: scale class %d left to online tuning",
                    limit, gone)  # fmt: skip
    return table


def _with_assignment(
    table: dict[str, Any],
    policy: NCCLTuningPolicySpec,
    coverage: ClassCoverage | None,
    job_uid: str,
) -> dict[str, Any]:
    """A learned table with the job's exploration assignment (policy/runtime/exploration.py),
    then the class's findings over the model's choices (policy/runtime/measured.py:
    measured beats modelled)."""
    if policy.mode is not Mode.LEARNED:
        return table
    try:
        exploration = importlib.import_module("dynamiccl.policy.runtime.exploration")
        measured = importlib.import_module("dynamiccl.policy.runtime.measured")
        plan = exploration.assign(
            DecisionTable.model_validate(table),
            coverage,
            job_uid,
            policy.exploration.budget_calls,
        )
        final = measured.apply_findings(plan.table, coverage)
    except ImportError:
        return table
    except Exception as exc:  # never break the job over exploration: keep the compiled table
        log.warning("exploration assignment failed (compiled table kept): %s", exc)
        return table
    out: dict[str, Any] = final.model_dump(mode="json")
    return out


def measured_cells(table: Mapping[str, Any], coverage: ClassCoverage | None) -> list[str]:
    """The cells of a job's table that came from the class's findings, one line each (for
    its TuningRun); none for an empty table or without the policy package."""
    if not table.get("cells") or coverage is None or "format" in table:
        return []
    try:
        measured = importlib.import_module("dynamiccl.policy.runtime.measured")
    except ImportError:
        return []
    found = measured.measured_cells(DecisionTable.model_validate(table), coverage)
    return [str(measured.describe(f)) for f in found]


def model_unavailable(table: Mapping[str, Any]) -> bool:
    """Is this the empty table of a model that could not be had (worth retrying later)?"""
    reason = str(table.get("reason", ""))
    return not table.get("cells") and reason.startswith(f"no-model:{table.get('model_version')}: ")

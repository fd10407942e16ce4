"""Parse and validate the ``dynamiccl.io/*`` annotations users put on training jobs.

Never raises on user input: every malformed value becomes an ``AnnotationError``
naming the key, the value and what was expected; the job then runs untuned
(operator issue: "malformed annotations → Event + condition, job runs untuned").

Grammar (values are case-insensitive, surrounding spaces ignored):

- ``tune``: ``true`` | ``false``
- ``parallelism``: ``MODE[:DIM=N,...]``, MODE ∈ dp tp pp fsdp 3d moe, DIM ∈ dp tp pp ep cp;
  e.g. ``3d:dp=4,tp=8,pp=2`` (cp: context parallel)
- ``model-size``: parameter count, plain or with K/M/B/T suffix: ``7B``, ``1.3b``, ``350M``
- ``sync-mode``: ``bsp`` | ``ssp`` | ``asp`` | ``local-sgd[:STEPS]``
- ``compression``: ``none`` | ``fp16`` | ``bf16`` | ``fp8`` | ``int8`` | ``onebit`` |
  ``topk:RATIO`` | ``powersgd:RATIO`` (RATIO in (0, 1], bytes sent per fp32 byte)
- ``ccl``: ``nccl`` | ``rccl`` | ``gloo`` | ``mpi`` | ``other``
- ``c2c-ratio``: non-negative number (compute time / communication time)
- ``in-network-aggregation``: ``true`` | ``false``
- ``policy``: the name of an NCCLTuningPolicy to use (it must still match the job)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from dynamiccl import constants as c
from dynamiccl.api.features import (
    CclLibrary,
    Compression,
    ParallelDegrees,
    Parallelism,
    SyncMode,
    WorkloadFeatures,
    parse_parallelism,
)

MAX_VALUE_LEN: Final = 256
_FIXED_RATIO: Final = {
    Compression.NONE: 1.0,
    Compression.FP16: 0.5,
    Compression.BF16: 0.5,
    Compression.FP8: 0.25,
    Compression.INT8: 0.25,
    Compression.ONEBIT: 1.0 / 32.0,
}
_SIZE_SUFFIX: Final = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_SIZE_RE: Final = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([kmbgt]?)$")
_DNS_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class AnnotationError:
    """One malformed annotation."""

    key: str
    value: str
    message: str

    def __str__(self) -> str:
        shown = self.value if len(self.value) <= 64 else self.value[:61] + "..."
        return f"{self.key}={shown!r}: {self.message}"


@dataclass(frozen=True)
class JobAnnotations:
    """What the annotations say; ``errors`` lists every malformed one."""

    tune: bool | None = None  # None: annotation absent (namespace label may opt in)
    workload: WorkloadFeatures = field(default_factory=WorkloadFeatures)
    ccl: CclLibrary = CclLibrary.NCCL
    ina_active: bool = False
    policy: str | None = None
    errors: tuple[AnnotationError, ...] = ()

    @property
    def valid(self) -> bool:
        """No malformed annotation."""
        return not self.errors


class _BadValueError(ValueError):
    pass


def _bool(value: str) -> bool:
    if value in ("true", "false"):
        return value == "true"
    raise _BadValueError("expected true or false")


E = TypeVar("E", Parallelism, SyncMode, Compression, CclLibrary)


def _enum_value(enum: type[E], value: str) -> E:
    try:
        return enum(value)
    except ValueError:
        raise _BadValueError(f"expected one of {', '.join(e.value for e in enum)}") from None


def _int(text: str, what: str) -> int:
    if not text.isdigit() or len(text) > 9:
        raise _BadValueError(f"{what} must be a positive integer (got {text!r})")
    return int(text)


def _ratio(text: str) -> float:
    try:
        ratio = float(text)
    except ValueError:
        raise _BadValueError(f"ratio must be a number in (0, 1] (got {text!r})") from None
    if not (0.0 < ratio <= 1.0) or not math.isfinite(ratio):
        raise _BadValueError(f"ratio must be in (0, 1] (got {text})")
    return ratio


def _parallelism(value: str) -> tuple[Parallelism, ParallelDegrees]:
    try:
        return parse_parallelism(value)
    except ValueError as exc:
        raise _BadValueError(str(exc)) from None


def _model_size(value: str) -> float:
    match = _SIZE_RE.match(value)
    if match is None:
        raise _BadValueError("expected a parameter count such as 7B, 1.3b, 350M or 125000000")
    params = float(match.group(1)) * _SIZE_SUFFIX[match.group(2)]
    if params <= 0 or params > 1e15 or not math.isfinite(params):
        raise _BadValueError("parameter count must be in (0, 1e15]")
    return params


def _sync(value: str) -> tuple[SyncMode, int]:
    mode_text, sep, steps = value.partition(":")
    mode = _enum_value(SyncMode, mode_text.strip())
    if sep and mode is not SyncMode.LOCAL_SGD:
        raise _BadValueError("only local-sgd takes :STEPS")
    if mode is SyncMode.LOCAL_SGD:
        return mode, _int(steps.strip(), "steps") if sep else 1
    return mode, 0


def _compression(value: str) -> tuple[Compression, float]:
    name, sep, ratio_text = value.partition(":")
    comp = _enum_value(Compression, name.strip())
    if comp in _FIXED_RATIO:
        if sep:
            raise _BadValueError(
                f"{comp.value} has a fixed ratio; only topk and powersgd take :RATIO"
            )
        return comp, _FIXED_RATIO[comp]
    if not sep:
        raise _BadValueError(f"{comp.value} needs :RATIO, e.g. {comp.value}:0.01")
    return comp, _ratio(ratio_text.strip())


def _c2c(value: str) -> float:
    try:
        ratio = float(value)
    except ValueError:
        raise _BadValueError("expected a non-negative number") from None
    if not math.isfinite(ratio) or ratio < 0:
        raise _BadValueError("expected a non-negative number")
    return ratio


def _policy(value: str) -> str:
    if not _DNS_NAME.match(value):
        raise _BadValueError("expected an NCCLTuningPolicy name (lower-case DNS name)")
    return value


# key → (JobAnnotations/WorkloadFeatures fields it sets, parser); "w." = workload field.
_FIELDS: Final[dict[str, tuple[tuple[str, ...], Callable[[str], Any]]]] = {
    c.ANNOTATION_TUNE: (("tune",), _bool),
    c.ANNOTATION_PARALLELISM: (("w.parallelism", "w.degrees"), _parallelism),
    c.ANNOTATION_MODEL_SIZE: (("w.model_params",), _model_size),
    c.ANNOTATION_SYNC_MODE: (("w.sync_mode", "w.local_steps"), _sync),
    c.ANNOTATION_COMPRESSION: (("w.compression", "w.compression_ratio"), _compression),
    c.ANNOTATION_C2C_RATIO: (("w.c2c_ratio",), _c2c),
    c.ANNOTATION_CCL: (("ccl",), lambda v: _enum_value(CclLibrary, v)),
    c.ANNOTATION_INA: (("ina_active",), _bool),
    c.ANNOTATION_POLICY: (("policy",), _policy),
}


def parse(annotations: Mapping[str, Any] | None) -> JobAnnotations:
    """Parse a job's annotations; unknown ``dynamiccl.io/*`` keys are errors too."""
    ann = annotations or {}
    errors: list[AnnotationError] = []
    top: dict[str, Any] = {}
    workload: dict[str, Any] = {}
    for key, (fields, parser) in _FIELDS.items():
        raw = ann.get(key)
        if raw is None:
            continue
        if not isinstance(raw, str) or len(raw) > MAX_VALUE_LEN:
            errors.append(AnnotationError(key, str(raw)[:80], "value too long or not a string"))
            continue
        try:
            text = raw.strip() if key == c.ANNOTATION_POLICY else raw.strip().lower()
            result = parser(text)
        except _BadValueError as exc:
            errors.append(AnnotationError(key, raw, str(exc)))
            continue
        values = result if len(fields) > 1 else (result,)
        for name, value in zip(fields, values, strict=True):
            if name.startswith("w."):
                workload[name[2:]] = value
            else:
                top[name] = value
    for key in sorted(ann):
        if key.startswith(c.GROUP + "/") and key not in _FIELDS and key not in _WRITTEN_BY_US:
            errors.append(AnnotationError(key, str(ann[key]), "unknown dynamiccl.io annotation"))
    try:
        wl = WorkloadFeatures.model_validate(workload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        errors.append(AnnotationError(c.GROUP + "/*", where, f"{where}: {first['msg']}"))
        wl = WorkloadFeatures()
    return JobAnnotations(workload=wl, errors=tuple(errors), **top)


_WRITTEN_BY_US: Final = frozenset(
    {c.ANNOTATION_INJECTED, c.ANNOTATION_USER_NCCL_ENV, c.ANNOTATION_CONFIG_DIGEST}
)


def opted_in(job_ann: JobAnnotations, namespace_labels: Mapping[str, str]) -> bool:
    """The job asks to be tuned: its annotation, else its namespace's label."""
    if job_ann.tune is not None:
        return job_ann.tune
    return namespace_labels.get(c.LABEL_NAMESPACE_TUNE, "").lower() == "true"

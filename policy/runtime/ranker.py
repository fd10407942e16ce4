"""What compile-to-table and `policy decide` need of a policy, and loading one without torch.

`Ranker` is implemented by the torch `inference.Policy` (training, evaluation)
and by the torch-free `numpy_policy.NumpyPolicy` (the operator, the CLI):
decisions at a fresh LSTM state. `load_ranker` prefers the exported `.npz`
next to a `.pt` model (no torch import) and falls back to torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
from numpy.typing import NDArray

from dynamiccl.policy.runtime.model_file import DEFAULT_MODEL, ModelError, file_sha256

log = logging.getLogger("dynamiccl.policy.runtime.ranker")
DEVIATE_CONFIDENCE: Final = 0.8  # for a model whose training config names none


def confidence_of(meta: dict[str, Any]) -> float:
    """The confidence a model's decisions need to leave NCCL's pick: its training config's
    `deviate_confidence` (chosen with the model, on held-out jobs), else 0.8."""
    config = meta.get("config")
    value = config.get("deviate_confidence") if isinstance(config, dict) else None
    return float(value) if isinstance(value, int | float) else DEVIATE_CONFIDENCE


class Ranker(Protocol):
    """A loaded policy's decisions and rankings (see `inference.Policy` for the semantics)."""

    @property
    def meta(self) -> dict[str, Any]: ...

    @property
    def tau(self) -> float: ...

    def decide(
        self,
        obs: NDArray[np.float32],
        feasible: NDArray[np.bool_],
        pick: NDArray[np.int64] | None = None,
        tau: float | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]: ...

    def top_actions(
        self,
        obs: NDArray[np.float32],
        feasible: NDArray[np.bool_],
        k: int,
        pick: NDArray[np.int64] | None = None,
        tau: float | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]: ...

    def joint_log_probs(
        self, obs: NDArray[np.float32], feasible: NDArray[np.bool_]
    ) -> NDArray[np.float32]: ...


def load_ranker(path: Path | None = None) -> Ranker:
    """A model for decisions (default: the shipped one), without torch when possible.

    An `.npz` path loads with numpy. For a `.pt` path, the `.npz` next to it is
    used when it was exported from exactly that file (its recorded sha256
    matches) or the `.pt` is absent; otherwise (no export, a stale or broken
    one) the `.pt` loads with torch.
    """
    from dynamiccl.policy.runtime.numpy_policy import NumpyPolicy  # noqa: PLC0415 - import cycle

    p = path or DEFAULT_MODEL
    if p.suffix == ".npz":
        return NumpyPolicy.load(p)
    npz = p.with_suffix(".npz")
    if npz.is_file():
        try:
            fast = NumpyPolicy.load(npz)
        except ModelError as exc:
            if not p.exists():
                raise
            log.warning("%s unusable, loading %s with torch: %s", npz, p, exc)
        else:
            if not p.exists() or fast.source_sha256 == file_sha256(p):
                return fast
            log.warning("%s was exported from another %s; loading it with torch", npz, p.name)
    from dynamiccl.policy.train.inference import Policy  # noqa: PLC0415 - torch only when needed

    return Policy.load(p)

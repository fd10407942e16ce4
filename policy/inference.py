"""A trained policy, loaded for decisions: greedy actions and candidate rankings.

Models are saved as one torch file holding the network's constructor
arguments, its weights, the observation layout version, the action options and
the training metadata (seed, command, metrics). A decision is made at a fresh
LSTM state: the compiled table is what a job starts with, and within-job
adaptation is the online tuner's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from numpy.typing import NDArray

from dynamiccl.policy.encode import OBS_DIM, OBS_VERSION
from dynamiccl.policy.model import PolicyNet, build
from dynamiccl.policy.space import CHANNEL_OPTIONS, CHUNK_OPTIONS, HEADS

MODELS_DIR: Final = Path(__file__).resolve().parent / "models"
DEFAULT_MODEL: Final = MODELS_DIR / "default.pt"


class ModelError(ValueError):
    """A model file is missing, unreadable or for another observation layout."""


@dataclass
class Policy:
    """A network in eval mode plus its metadata."""

    net: PolicyNet
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None = None) -> Policy:
        """Load a saved model (default: the one shipped in the package)."""
        p = path or DEFAULT_MODEL
        try:
            blob = torch.load(p, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise ModelError(f"{p}: model file not found") from None
        except Exception as exc:  # torch raises many types for corrupt files
            raise ModelError(f"{p}: not a DynamICCL model: {exc}") from None
        if not isinstance(blob, dict) or "config" not in blob or "state" not in blob:
            raise ModelError(f"{p}: not a DynamICCL model (missing config/state)")
        if blob.get("obs_version") != OBS_VERSION or blob["config"].get("obs_dim") != OBS_DIM:
            raise ModelError(
                f"{p}: observation layout v{blob.get('obs_version')} does not match "
                f"this code's v{OBS_VERSION}; retrain with `dynamiccl train`"
            )
        if (
            tuple(blob.get("channel_options", ())) != CHANNEL_OPTIONS
            or tuple(blob.get("chunk_options", ())) != CHUNK_OPTIONS
        ):
            raise ModelError(f"{p}: action options differ from this code's; retrain")
        net = build(blob["config"])
        net.load_state_dict(blob["state"])
        net.eval()
        return cls(net=net, meta=dict(blob.get("meta", {})))

    def save(self, path: Path) -> None:
        """Write the model file (deterministic content for identical weights)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "config": self.net.config(),
                "state": self.net.state_dict(),
                "obs_version": OBS_VERSION,
                "channel_options": list(CHANNEL_OPTIONS),
                "chunk_options": list(CHUNK_OPTIONS),
                "meta": self.meta,
            },
            path,
        )

    def _h(self, obs: NDArray[np.float32]) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))[:, None, :]
        prev = torch.full((x.shape[0], 1, 4), -1, dtype=torch.long)
        h, _ = self.net.trunk(x, prev, torch.zeros(x.shape[0], 1))
        return h[:, 0]

    def greedy(self, obs: NDArray[np.float32], feasible: NDArray[np.bool_]) -> NDArray[np.int64]:
        """Greedy head-by-head actions [n, 4] (indices into the head options)."""
        with torch.no_grad():
            step = self.net.act(self._h(obs), torch.from_numpy(feasible), greedy=True)
        out: NDArray[np.int64] = step.actions.numpy().astype(np.int64)
        return out

    def joint_log_probs(
        self, obs: NDArray[np.float32], feasible: NDArray[np.bool_]
    ) -> NDArray[np.float32]:
        """[n, A, P, C, K] log-probabilities (-inf where infeasible)."""
        with torch.no_grad():
            out = self.net.joint_log_probs(self._h(obs), torch.from_numpy(feasible))
        arr: NDArray[np.float32] = out.numpy()
        return arr


def new_policy(seed: int, hidden: int = 128) -> Policy:
    """A freshly initialised policy (seeded)."""
    torch.manual_seed(seed)
    return Policy(net=PolicyNet(OBS_DIM, HEADS, hidden=hidden))

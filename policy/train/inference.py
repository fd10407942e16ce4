"""A trained policy, loaded for decisions: greedy actions and candidate rankings.

Models are saved as one torch file holding the network's constructor
arguments, its weights, the observation layout version, the action options and
the training metadata (seed, command, metrics), and the peers' constructor
arguments and weights if the model has peers (a seed ensemble: they give the
second opinion of `decision_rule.pooled_pair`). A decision is made at a fresh
LSTM state: the compiled table is what a job starts with, and within-job
adaptation is the online tuner's job. `Policy.export_npz` writes the same
model as a numpy archive for the torch-free `numpy_policy.NumpyPolicy`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from dynamiccl.policy.runtime.decision_rule import (
    PairFn,
    fall_back_to_pick,
    merge_with_beam,
    pooled_pair,
)
from dynamiccl.policy.runtime.encode import (
    OBS_DIM,
    OBS_VERSION,
    PICK_ALGO_OFFSET,
    PICK_PROTO_OFFSET,
)
from dynamiccl.policy.runtime.model_file import (
    DEFAULT_MODEL,
    MODELS_DIR,
    NPZ_FORMAT,
    ModelError,
    check_layout,
    write_npz,
)
from dynamiccl.policy.runtime.ranker import DEVIATE_CONFIDENCE, confidence_of
from dynamiccl.policy.runtime.space import CHANNEL_OPTIONS, CHUNK_OPTIONS, HEADS
from dynamiccl.policy.train.model import PolicyNet, build

# Re-exported: these lived here before the torch-free modules existed.
__all__ = [
    "DEFAULT_MODEL",
    "DEVIATE_CONFIDENCE",
    "MODELS_DIR",
    "ModelError",
    "Policy",
    "new_policy",
]


def _trunk(net: PolicyNet, obs: NDArray[np.float32]) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))[:, None, :]
    prev = torch.full((x.shape[0], 1, 4), -1, dtype=torch.long)
    h, _ = net.trunk(x, prev, torch.zeros(x.shape[0], 1))
    return h[:, 0]


def _load_net(blob: dict[str, Any]) -> PolicyNet:
    net = build(blob["config"])
    net.load_state_dict(blob["state"])
    net.eval()
    return net


@dataclass
class Policy:
    """A network in eval mode plus its metadata and its peers (a seed ensemble, may be empty)."""

    net: PolicyNet
    meta: dict[str, Any] = field(default_factory=dict)
    peers: tuple[PolicyNet, ...] = ()

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
        check_layout(
            p,
            blob.get("obs_version"),
            blob["config"].get("obs_dim"),
            blob.get("channel_options", ()),
            blob.get("chunk_options", ()),
        )
        peers = blob.get("peers", [])
        if not isinstance(peers, list) or not all(
            isinstance(x, dict) and x.get("config", {}).get("obs_dim") == OBS_DIM and "state" in x
            for x in peers
        ):
            raise ModelError(f"{p}: peers must be networks of this layout (config and state)")
        try:
            nets = [_load_net(blob), *(_load_net(x) for x in peers)]
        except (KeyError, RuntimeError, TypeError) as exc:
            raise ModelError(f"{p}: weights do not fit the network config: {exc}") from None
        return cls(net=nets[0], meta=dict(blob.get("meta", {})), peers=tuple(nets[1:]))

    def save(self, path: Path) -> None:
        """Write the model file (deterministic content for identical weights)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        blob: dict[str, Any] = {
            "config": self.net.config(),
            "state": self.net.state_dict(),
            "obs_version": OBS_VERSION,
            "channel_options": list(CHANNEL_OPTIONS),
            "chunk_options": list(CHUNK_OPTIONS),
            "meta": self.meta,
        }
        if self.peers:
            blob["peers"] = [{"config": n.config(), "state": n.state_dict()} for n in self.peers]
        torch.save(blob, path)

    def export_npz(self, path: Path, source_sha256: str | None = None) -> None:
        """Write the model for `numpy_policy.NumpyPolicy` (identical weights: identical bytes).

        Weights as float32 arrays `state/<name>`, the network config and the
        metadata as JSON text, the layout version and the action options;
        `source_sha256` records the `.pt` file it comes from.
        """
        arrays: dict[str, NDArray[Any]] = {
            f"state/{name}": np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32)
            for name, t in self.net.state_dict().items()
        }
        arrays["format"] = np.array(NPZ_FORMAT)
        arrays["config"] = np.array(json.dumps(self.net.config(), sort_keys=True))
        arrays["meta"] = np.array(json.dumps(self.meta, sort_keys=True))
        arrays["obs_version"] = np.array(OBS_VERSION, dtype=np.int64)
        arrays["channel_options"] = np.array(CHANNEL_OPTIONS, dtype=np.int64)
        arrays["chunk_options"] = np.array(CHUNK_OPTIONS, dtype=np.int64)
        for i, peer in enumerate(self.peers):
            arrays[f"peer{i}/config"] = np.array(json.dumps(peer.config(), sort_keys=True))
            for name, t in peer.state_dict().items():
                arrays[f"peer{i}/state/{name}"] = np.ascontiguousarray(
                    t.detach().cpu().numpy(), dtype=np.float32
                )
        if source_sha256:
            arrays["source_sha256"] = np.array(source_sha256)
        write_npz(path, arrays)

    @property
    def tau(self) -> float:
        """The confidence its decisions need to leave NCCL's pick (`ranker.confidence_of`)."""
        return confidence_of(self.meta)

    def _h(self, obs: NDArray[np.float32]) -> torch.Tensor:
        return _trunk(self.net, obs)

    def _peer_pairs(self, obs: NDArray[np.float32], f: torch.Tensor) -> list[PairFn]:
        def fn(net: PolicyNet) -> PairFn:
            def pair(rows: NDArray[np.int64]) -> NDArray[np.float32]:
                idx = torch.from_numpy(rows)
                out: NDArray[np.float32] = (
                    net.pair_log_probs(_trunk(net, obs[rows]), f[idx]).exp().numpy()
                )
                return out

            return pair

        return [fn(n) for n in self.peers]

    def greedy(self, obs: NDArray[np.float32], feasible: NDArray[np.bool_]) -> NDArray[np.int64]:
        """Greedy head-by-head actions [n, 4] (indices into the head options)."""
        with torch.inference_mode():
            step = self.net.act(self._h(obs), torch.from_numpy(feasible), greedy=True)
        out: NDArray[np.int64] = step.actions.numpy().astype(np.int64)
        return out

    def _first(  # noqa: PLR0917 - the trunk, its inputs and the rule's parameters
        self,
        obs: NDArray[np.float32],
        h: torch.Tensor,
        f: torch.Tensor,
        pick: NDArray[np.int64] | None,
        tau: float | None,
        pair_logp: torch.Tensor | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """The decision: greedy, unless it leaves NCCL's (algo, proto) with confidence < tau
        (the members' mean probability of the new pair when the model has peers)."""
        tau = self.tau if tau is None else tau
        greedy = self.net.act(h, f, greedy=True)
        acts = greedy.actions.numpy().astype(np.int64)
        logp = greedy.log_prob.numpy().astype(np.float64)
        if pick is None or tau <= 0:
            return acts, np.exp(logp)
        if pair_logp is None:
            pair_logp = self.net.pair_log_probs(h, f)
        pair = pooled_pair(acts, pair_logp.exp().numpy(), pick, self._peer_pairs(obs, f))
        back = fall_back_to_pick(acts, logp, pair, pick=pick, feasible=f.numpy(), tau=tau)
        if back.any():
            lp = self.net.act(h, f, actions=torch.from_numpy(acts)).log_prob.numpy()
            logp = np.where(back, lp.astype(np.float64), logp)
        return acts, np.exp(logp)

    def decide(
        self,
        obs: NDArray[np.float32],
        feasible: NDArray[np.bool_],
        pick: NDArray[np.int64] | None = None,
        tau: float | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Decisions [n, 4] and their probabilities [n].

        The greedy action, except that leaving NCCL's own (algorithm, protocol)
        `pick` [n, 2] needs the policy's marginal probability of the new pair (the
        mean over the members when the model has peers) to be at least `tau`
        (and forcing channels or chunk on NCCL's pair needs their conditional
        probability to be at least `tau`); otherwise NCCL's pick with its own
        channels and chunk stands. `tau` None = the model's own
        (`ranker.confidence_of`); docs/policy.md §5 has the trade-off table.
        """
        with torch.inference_mode():
            return self._first(obs, self._h(obs), torch.from_numpy(feasible), pick, tau)

    def top_actions(
        self,
        obs: NDArray[np.float32],
        feasible: NDArray[np.bool_],
        k: int,
        pick: NDArray[np.int64] | None = None,
        tau: float | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """The decision first, then the beam's most probable others: [n, k, 4], probs [n, k].

        Rows with fewer than k feasible actions are padded with probability 0
        (their actions repeat the first one).
        """
        with torch.inference_mode():
            h = self._h(obs)
            f = torch.from_numpy(feasible)
            pair_logp = self.net.pair_log_probs(h, f)
            g, p0 = self._first(obs, h, f, pick, tau, pair_logp)
            acts, lp = self.net.beam(h, f, k + 1, pair_logp)
        beam_a = acts.numpy().astype(np.int64)
        beam_p = np.exp(lp.numpy().astype(np.float64))
        return merge_with_beam(g, p0, beam_a, beam_p, k)

    def joint_log_probs(
        self, obs: NDArray[np.float32], feasible: NDArray[np.bool_]
    ) -> NDArray[np.float32]:
        """[n, A, P, C, K] log-probabilities (-inf where infeasible)."""
        with torch.inference_mode():
            out = self.net.joint_log_probs(self._h(obs), torch.from_numpy(feasible))
        arr: NDArray[np.float32] = out.numpy()
        return arr


def new_policy(seed: int, hidden: int = 128) -> Policy:
    """A freshly initialised policy (seeded), biased towards NCCL's own pick."""
    torch.manual_seed(seed)
    offsets = (PICK_ALGO_OFFSET, PICK_PROTO_OFFSET)
    return Policy(net=PolicyNet(OBS_DIM, HEADS, hidden=hidden, pick_offsets=offsets))

"""The learned policy's decisions in plain numpy: compile-to-table without importing torch.

A port of the parts of `model.PolicyNet` and `inference.Policy` that decisions
use, at a fresh LSTM state (no previous action, previous reward 0): the trunk
for one step, the masked autoregressive heads (greedy and scoring), the
marginal (algorithm, protocol) log-probabilities, the beam search and the
"leave NCCL's pick only when confident" rule. Float32 like torch, the same
masked logit (-1e9) and the same tie-breaking (first index wins), so the
decisions and their probabilities match the torch policy's
(tests/unit/policy/runtime/test_numpy_policy.py). Weights come from the `.npz` that
`Policy.export_npz` writes (`python -m dynamiccl.policy.train.export`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dynamiccl.policy.runtime.decision_rule import (
    PairFn,
    fall_back_to_pick,
    merge_with_beam,
    pooled_pair,
)
from dynamiccl.policy.runtime.heads import NEG_INF, HeadSizes
from dynamiccl.policy.runtime.model_file import (
    DEFAULT_NPZ,
    NPZ_FORMAT,
    ModelError,
    check_layout,
    check_weights,
)
from dynamiccl.policy.runtime.numpy_net import B8, F32, I64, Feasible, Net, Trunk, log_softmax, mask
from dynamiccl.policy.runtime.ranker import confidence_of

_TAKEN: Final = np.iinfo(np.int32).min


def _topk(x: F32, k: int) -> tuple[F32, I64]:
    """Largest k along the last axis of [n, m], best first (ties: the lower index first;
    NaN after -inf): a stable descending argsort's first k, by k argmax passes over the
    values as order-preserving integers (a sort of every row costs more for k << m)."""
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] <= 32:  # a sort is cheaper there
        idx: I64 = np.argsort(-x, axis=-1, kind="stable")[..., :k]
        return np.take_along_axis(x, idx, -1), idx
    v = x + np.float32(0.0)  # -0.0 ties with 0.0
    bits = v.view(np.int32)
    key = bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))  # float order as int32 order
    key[np.isnan(v)] = _TAKEN + 1
    rows = np.arange(x.shape[0])
    idx = np.empty((x.shape[0], k), dtype=np.int64)
    for j in range(k):
        best = key.argmax(-1)
        idx[:, j] = best
        key[rows, best] = _TAKEN
    return np.take_along_axis(x, idx, -1), idx


def _text(blob: Mapping[str, NDArray[Any]], key: str) -> str:
    if key not in blob:
        raise ModelError(f"missing {key!r}")
    return str(blob[key][()])


class NumpyPolicy:
    """A model's weights as float32 arrays, with `inference.Policy`'s decision methods."""

    def __init__(
        self,
        config: Mapping[str, Any],
        state: Mapping[str, NDArray[Any]],
        meta: Mapping[str, Any] | None = None,
        source_sha256: str | None = None,
        peers: Sequence[NumpyPolicy] = (),
    ) -> None:
        self.config = dict(config)
        self.heads = HeadSizes(*(int(x) for x in config["heads"]))
        self.hidden = int(config["hidden"])
        offsets = config.get("pick_offsets")
        self.pick_offsets = (int(offsets[0]), int(offsets[1])) if offsets else None
        self.w = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()}
        self.net = Net(self.w, self.heads, self.hidden)
        self.meta: dict[str, Any] = dict(meta or {})
        self.source_sha256 = source_sha256  # of the .pt it was exported from, if recorded
        self.peers = tuple(peers)  # the seed ensemble's other members (decision_rule)

    @classmethod
    def load(cls, path: Path | None = None, *, data: bytes | None = None) -> NumpyPolicy:
        """Load an exported model (default: the shipped `default.npz`), or the archive's
        bytes given as `data` (a model fetched over the network); ModelError if unusable."""
        p: Any = path or DEFAULT_NPZ
        source: Any = p
        if data is not None:
            p, source = "model archive", io.BytesIO(data)
        try:
            with np.load(source, allow_pickle=False) as z:
                blob = {name: z[name] for name in z.files}
        except FileNotFoundError:
            raise ModelError(f"{p}: model file not found") from None
        except Exception as exc:  # zip, npy header and pickle errors alike
            raise ModelError(f"{p}: not a DynamICCL model archive (.npz): {exc}") from None
        if "format" not in blob:
            raise ModelError(
                f"{p}: not a DynamICCL model archive (.npz): no format marker "
                "(export a .pt model with `python -m dynamiccl.policy.train.export`)"
            )
        try:
            fmt = _text(blob, "format")
            if fmt != NPZ_FORMAT:
                raise ModelError(f"format {fmt!r}, expected {NPZ_FORMAT!r}")
            config = json.loads(_text(blob, "config"))
            meta = json.loads(_text(blob, "meta"))
            if not isinstance(config, dict) or not isinstance(meta, dict):
                raise ModelError("config and meta must be JSON objects")
            version = int(blob["obs_version"]) if "obs_version" in blob else None
            channels = blob["channel_options"].tolist() if "channel_options" in blob else []
            chunks = blob["chunk_options"].tolist() if "chunk_options" in blob else []
            source = _text(blob, "source_sha256") if "source_sha256" in blob else ""
            state = {k[6:]: v for k, v in blob.items() if k.startswith("state/")}
            peers: list[tuple[str, Any, dict[str, NDArray[Any]]]] = []
            while f"peer{len(peers)}/config" in blob:
                pre = f"peer{len(peers)}/"
                peer_config = json.loads(_text(blob, pre + "config"))
                n = len(pre) + 6
                peer_state = {k[n:]: v for k, v in blob.items() if k.startswith(pre + "state/")}
                peers.append((pre, peer_config, peer_state))
        except (ModelError, KeyError, ValueError, TypeError) as exc:
            raise ModelError(f"{p}: not a DynamICCL model archive (.npz): {exc}") from None
        check_layout(p, version, config.get("obs_dim"), channels, chunks)
        check_weights(p, "", config, state)
        members = []
        for pre, peer_config, peer_state in peers:
            if not isinstance(peer_config, dict) or peer_config.get("obs_dim") != config["obs_dim"]:
                raise ModelError(f"{p}: {pre}config is not a network of this layout")
            check_weights(p, pre, peer_config, peer_state)
            members.append(cls(peer_config, peer_state))
        return cls(config, state, meta, source or None, members)

    @property
    def tau(self) -> float:
        """The confidence its decisions need to leave NCCL's pick (`ranker.confidence_of`)."""
        return confidence_of(self.meta)

    def _peer_pairs(self, obs: F32, f: Feasible) -> list[PairFn]:
        def fn(net: NumpyPolicy) -> PairFn:
            def pair(rows: I64) -> F32:
                out: F32 = np.exp(net.pair_log_probs(net._h(obs[rows]), f.rows(rows)))
                return out

            return pair

        return [fn(n) for n in self.peers]

    # --- network (numpy_net.Net) ----------------------------------------------
    def _h(self, obs: F32) -> Trunk:
        """The trunk for one step from a zero LSTM state, no previous action, reward 0."""
        return self.net.trunk(obs, self.pick_offsets)

    def act(self, t: Trunk, f: Feasible, actions: I64 | None = None) -> tuple[I64, F32]:
        """Greedy actions [N, 4] (or the given `actions`) and their log-probabilities [N]."""
        n = t.core.shape[0]
        rows = np.arange(n)
        picks: list[I64] = []

        def choose(lg: F32, i: int) -> I64:
            chosen: I64 = lg.argmax(-1) if actions is None else actions[:, i]
            picks.append(chosen)
            return chosen

        lg = mask(t.algo, f.a)
        a = choose(lg, 0)
        logp = log_softmax(lg)[rows, a]
        lg = mask(self.net.proto_logits(t, a), f.ap[rows, a])
        p = choose(lg, 1)
        logp = logp + log_softmax(lg)[rows, p]
        lg = mask(self.net.ch_logits(t, a, p), f.apc[rows, a, p])
        c = choose(lg, 2)
        logp = logp + log_softmax(lg)[rows, c]
        lg = mask(self.net.chunk_logits(t, a, p, c), f.full[rows, a, p, c])
        k = choose(lg, 3)
        out: F32 = logp + log_softmax(lg)[rows, k]
        return np.stack(picks, -1).astype(np.int64), out

    def _pair_parts(self, t: Trunk, f: Feasible) -> tuple[F32, F32]:
        """Algorithm log-probs [N, A] and protocol log-probs given each algorithm [N, A, P]."""
        la = log_softmax(mask(t.algo, f.a))
        logits = self.net.proto_logits(t, np.arange(self.heads.algo), lead=1)
        lp = log_softmax(mask(logits, f.ap))
        return la, lp

    def pair_log_probs(self, t: Trunk, f: Feasible) -> F32:
        """Marginal log-probability of every (algo, proto): [N, A, P]."""
        la, lp = self._pair_parts(t, f)
        out: F32 = la[:, :, None] + lp
        return out

    def beam(self, t: Trunk, f: Feasible, k: int, pair_logp: F32 | None = None) -> tuple[I64, F32]:
        """The k most probable joint actions [N, k, 4] and log-probs [N, k] (`PolicyNet.beam`)."""
        n = t.core.shape[0]
        rows = np.arange(n)[:, None]
        _, p_n, c_n, k_n = self.heads.as_tuple()
        if pair_logp is None:
            pair_logp = self.pair_log_probs(t, f)
        pairs = pair_logp.reshape(n, -1)
        lp1, top = _topk(pairs, min(k, pairs.shape[1]))
        a, p = top // p_n, top % p_n
        lc = log_softmax(mask(self.net.ch_logits(t, a, p, 1), f.apc[rows, a, p]))
        score2 = (lp1[:, :, None] + lc).reshape(n, -1)
        lp2, top2 = _topk(score2, min(k, score2.shape[1]))
        beam_i, c = top2 // c_n, top2 % c_n
        a2, p2 = np.take_along_axis(a, beam_i, 1), np.take_along_axis(p, beam_i, 1)
        f_c = f.full[rows, a2, p2, c]  # [N, kc, K]
        lk = log_softmax(mask(self.net.chunk_logits(t, a2, p2, c, 1), f_c))
        score3 = (lp2[:, :, None] + lk).reshape(n, -1)
        ok = f_c.reshape(n, -1) & np.isfinite(score3) & (score3 > NEG_INF / 2)
        score3 = np.where(ok, score3, np.float32(-np.inf))
        lp3, top3 = _topk(score3, min(k, score3.shape[1]))
        bi, ck = top3 // k_n, top3 % k_n
        parts = [np.take_along_axis(v, bi, 1) for v in (a2, p2, c)]
        return np.stack([*parts, ck], -1).astype(np.int64), lp3

    # --- decisions (inference.Policy) ------------------------------------------
    def _first(  # noqa: PLR0917 - the trunk, its inputs and the rule's parameters
        self,
        obs: F32,
        t: Trunk,
        f: Feasible,
        pick: I64 | None,
        tau: float | None,
        pair_logp: F32 | None = None,
    ) -> tuple[I64, NDArray[np.float64]]:
        """The decision: greedy, unless it leaves NCCL's (algo, proto) with confidence < tau
        (the members' mean probability of the new pair when the model has peers)."""
        tau = self.tau if tau is None else tau
        acts, lp32 = self.act(t, f)
        logp = lp32.astype(np.float64)
        if pick is None or tau <= 0:
            return acts, np.exp(logp)
        if pair_logp is None:
            pair_logp = self.pair_log_probs(t, f)
        pair = pooled_pair(acts, np.exp(pair_logp), pick, self._peer_pairs(obs, f))
        back = fall_back_to_pick(acts, logp, pair, pick=pick, feasible=f.full, tau=tau)
        if back.any():
            lp = self.act(t, f, actions=acts)[1]
            logp = np.where(back, lp.astype(np.float64), logp)
        return acts, np.exp(logp)

    def greedy(self, obs: F32, feasible: B8) -> I64:
        """Greedy head-by-head actions [n, 4] (indices into the head options)."""
        return self.act(self._h(obs), Feasible.of(feasible))[0]

    def decide(
        self,
        obs: F32,
        feasible: B8,
        pick: I64 | None = None,
        tau: float | None = None,
    ) -> tuple[I64, NDArray[np.float64]]:
        """Decisions [n, 4] and their probabilities [n] (`inference.Policy.decide`)."""
        return self._first(obs, self._h(obs), Feasible.of(feasible), pick, tau)

    def top_actions(
        self,
        obs: F32,
        feasible: B8,
        k: int,
        pick: I64 | None = None,
        tau: float | None = None,
    ) -> tuple[I64, NDArray[np.float64]]:
        """The decision first, then the beam's most probable others (`Policy.top_actions`)."""
        t, f = self._h(obs), Feasible.of(feasible)
        pair_logp = self.pair_log_probs(t, f)
        g, p0 = self._first(obs, t, f, pick, tau, pair_logp)
        beam_a, lp = self.beam(t, f, k + 1, pair_logp)
        beam_p = np.exp(lp.astype(np.float64))
        return merge_with_beam(g, p0, beam_a, beam_p, k)

    def joint_log_probs(self, obs: F32, feasible: B8) -> F32:
        """[n, A, P, C, K] log-probabilities (-inf where infeasible)."""
        t, f = self._h(obs), Feasible.of(feasible)
        la, lp = self._pair_parts(t, f)
        a_n, p_n, c_n, _ = self.heads.as_tuple()
        a, p, c = np.arange(a_n), np.arange(p_n), np.arange(c_n)
        lc = self.net.ch_logits(t, a[:, None], p[None, :], lead=2)  # [N, A, P, C]
        lc = log_softmax(mask(lc, f.apc))
        lk = self.net.chunk_logits(t, a[:, None, None], p[None, :, None], c[None, None], lead=3)
        lk = log_softmax(mask(lk, f.full))  # [N, A, P, C, K]
        joint = la[:, :, None, None, None] + lp[:, :, :, None, None] + lc[..., None] + lk
        out: F32 = np.where(f.full, joint, np.float32(-np.inf))
        return out

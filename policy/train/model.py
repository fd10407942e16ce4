"""The learned policy: a recurrent (LSTM) actor-critic with masked,
autoregressive categorical heads for algorithm, protocol, channels and chunk.

Input per step: the encoded state features of the call (topology, workload,
environment, collective, size; see `encode.py`) plus the previous action and
reward of the same stream, so the LSTM can adapt within a job. Output: a value
estimate and four heads, each conditioned on the choices before it
(algo -> proto -> channels -> chunk), because the best protocol depends on the
algorithm, the best channel count on both, and so on.

Masks make infeasible actions impossible, never merely unlikely: the joint
feasibility tensor `[A, P, C, K]` of a state is reduced to each head's mask
given the earlier choices (a choice is allowed iff some completion is
feasible), and masked logits are set to -inf before the softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dynamiccl.policy.runtime.heads import NEG_INF, HeadSizes


@dataclass
class Step:
    """Sampled (or evaluated) actions with their log-probability and entropy."""

    actions: Tensor  # [..., 4] long
    log_prob: Tensor  # [...]
    entropy: Tensor  # [...]


class PolicyNet(nn.Module):
    """LSTM actor-critic over per-call observations."""

    def __init__(
        self,
        obs_dim: int,
        heads: HeadSizes,
        hidden: int = 128,
        emb: int = 16,
        pick_offsets: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.heads = heads
        self.hidden = hidden
        # Where the observation holds NCCL's own (algo, proto) pick as one-hots:
        # the heads add them to their logits with a learned gain, so agreeing
        # with NCCL is the default and a deviation has to be learned.
        self.pick_offsets = pick_offsets
        self.pick_gain = nn.Parameter(torch.tensor([3.0, 3.0]))
        in_dim = obs_dim + heads.total + 1  # obs + previous action one-hots + previous reward
        self.encoder = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()
        )
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.post = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.Tanh())
        self.emb_algo = nn.Embedding(heads.algo, emb)
        self.emb_proto = nn.Embedding(heads.proto, emb)
        self.emb_ch = nn.Embedding(heads.channels, emb)
        self.head_algo = nn.Linear(hidden, heads.algo)
        self.head_proto = nn.Linear(hidden + emb, heads.proto)
        self.head_ch = nn.Linear(hidden + 2 * emb, heads.channels)
        self.head_chunk = nn.Linear(hidden + 3 * emb, heads.chunk)
        self.value = nn.Linear(hidden, 1)

    def config(self) -> dict[str, Any]:
        """Constructor arguments (saved with the weights)."""
        return {
            "obs_dim": self.obs_dim,
            "heads": list(self.heads.as_tuple()),
            "hidden": self.hidden,
            "emb": self.emb_algo.embedding_dim,
            "pick_offsets": list(self.pick_offsets) if self.pick_offsets else None,
        }

    # --- trunk ---------------------------------------------------------------
    def trunk(
        self,
        obs: Tensor,
        prev_action: Tensor,
        prev_reward: Tensor,
        state: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """obs [B,T,obs_dim], prev_action [B,T,4] (long, -1 = none), prev_reward [B,T]."""
        onehots = self._onehot_actions(prev_action)
        x = torch.cat([obs, onehots, prev_reward.unsqueeze(-1)], dim=-1)
        e = self.encoder(x)
        out, new_state = self.lstm(e, state)
        # The skip connection lets a single step (compile-to-table, fresh state)
        # decide from the features alone while the LSTM adds within-job context.
        h = self.post(torch.cat([e, out], dim=-1))
        a_n, p_n = self.heads.algo, self.heads.proto
        if self.pick_offsets is None:
            pick = torch.zeros((*h.shape[:-1], a_n + p_n))
        else:
            oa, op = self.pick_offsets
            pick = torch.cat([obs[..., oa : oa + a_n], obs[..., op : op + p_n]], -1)
        return torch.cat([h, pick], -1), new_state

    # The trunk's output carries NCCL's pick after the hidden units.
    def _core(self, h: Tensor) -> Tensor:
        return h[..., : self.hidden]

    def _algo_logits(self, h: Tensor) -> Tensor:
        a_n = self.heads.algo
        bias = h[..., self.hidden : self.hidden + a_n]
        out: Tensor = self.head_algo(self._core(h)) + self.pick_gain[0] * bias
        return out

    def _proto_logits(self, h: Tensor, ea: Tensor) -> Tensor:
        lo = self.hidden + self.heads.algo
        bias = h[..., lo : lo + self.heads.proto]
        out: Tensor = self.head_proto(torch.cat([self._core(h), ea], -1))
        return out + self.pick_gain[1] * bias

    def _onehot_actions(self, a: Tensor) -> Tensor:
        if bool((a < 0).all()):  # no previous action (a fresh state): all zeros
            return torch.zeros((*a.shape[:-1], self.heads.total), device=a.device)
        parts = []
        for i, n in enumerate(self.heads.as_tuple()):
            idx = a[..., i]
            oh = torch.zeros((*idx.shape, n), dtype=torch.float32, device=a.device)
            valid = idx >= 0
            oh[valid] = nn.functional.one_hot(idx[valid], n).float()
            parts.append(oh)
        return torch.cat(parts, dim=-1)

    def value_of(self, h: Tensor) -> Tensor:
        out: Tensor = self.value(self._core(h))
        return out.squeeze(-1)

    # --- heads -----------------------------------------------------------------
    def act(
        self,
        h: Tensor,
        feasible: Tensor,
        actions: Tensor | None = None,
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> Step:
        """Sample (or score given `actions`) through the masked autoregressive heads.

        h: [N, hidden]; feasible: [N, A, P, C, K] bool; actions: [N, 4] long.
        """
        n = h.shape[0]
        rows = torch.arange(n)
        picks: list[Tensor] = []
        logp = torch.zeros(n)
        ent = torch.zeros(n)
        m_a = feasible.flatten(2).any(-1)  # [N, A]
        lg = self._mask(self._algo_logits(h), m_a)
        a = self._choose(lg, actions, 0, greedy, generator)
        picks.append(a)
        lp, en = self._logp_ent(lg, a)
        logp, ent = logp + lp, ent + en
        f_a = feasible[rows, a]  # [N, P, C, K]
        ea = self.emb_algo(a)
        lg = self._mask(self._proto_logits(h, ea), f_a.flatten(2).any(-1))
        p = self._choose(lg, actions, 1, greedy, generator)
        picks.append(p)
        lp, en = self._logp_ent(lg, p)
        logp, ent = logp + lp, ent + en
        f_p = f_a[rows, p]  # [N, C, K]
        ep = self.emb_proto(p)
        core = self._core(h)
        lg = self._mask(self.head_ch(torch.cat([core, ea, ep], -1)), f_p.any(-1))
        c = self._choose(lg, actions, 2, greedy, generator)
        picks.append(c)
        lp, en = self._logp_ent(lg, c)
        logp, ent = logp + lp, ent + en
        f_c = f_p[rows, c]  # [N, K]
        ec = self.emb_ch(c)
        lg = self._mask(self.head_chunk(torch.cat([core, ea, ep, ec], -1)), f_c)
        k = self._choose(lg, actions, 3, greedy, generator)
        picks.append(k)
        lp, en = self._logp_ent(lg, k)
        return Step(torch.stack(picks, -1), logp + lp, ent + en)

    def pair_log_probs(self, h: Tensor, feasible: Tensor) -> Tensor:
        """Marginal log-probability of every (algo, proto): [N, hidden] -> [N, A, P]."""
        a_n = self.heads.algo
        n = h.shape[0]
        f = feasible
        la = torch.log_softmax(self._mask(self._algo_logits(h), f.flatten(2).any(-1)), -1)
        ea = self.emb_algo(torch.arange(a_n))
        hx = h[:, None, :].expand(n, a_n, -1)
        lp = torch.log_softmax(
            self._mask(self._proto_logits(hx, ea[None].expand(n, -1, -1)), f.flatten(3).any(-1)),
            -1,
        )
        out: Tensor = la[:, :, None] + lp
        return out

    def beam(
        self, h: Tensor, feasible: Tensor, k: int, pair_logp: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The k most probable joint actions by beam search (beam width k).

        h [N, hidden], feasible [N, A, P, C, K] -> actions [N, k, 4], log-probs [N, k]
        (-inf for padding when fewer than k actions are feasible), best first.
        """
        n = h.shape[0]
        rows = torch.arange(n)[:, None]
        if pair_logp is None:
            pair_logp = self.pair_log_probs(h, feasible)
        pairs = pair_logp.reshape(n, -1)  # [N, A*P]
        p_n = self.heads.proto
        kb = min(k, pairs.shape[1])
        lp1, top = _topk(pairs, kb)  # [N, kb]
        a, p = top // p_n, top % p_n
        hb = self._core(h)[:, None, :].expand(n, kb, -1)
        ea, ep = self.emb_algo(a), self.emb_proto(p)
        f_ap = feasible[rows, a, p]  # [N, kb, C, K]
        lc = torch.log_softmax(
            self._mask(self.head_ch(torch.cat([hb, ea, ep], -1)), f_ap.any(-1)), -1
        )
        c_n = self.heads.channels
        score2 = (lp1[:, :, None] + lc).reshape(n, -1)  # [N, kb*C]
        kc = min(k, score2.shape[1])
        lp2, top2 = _topk(score2, kc)
        beam_i, c = top2 // c_n, top2 % c_n
        a2, p2 = a.gather(1, beam_i), p.gather(1, beam_i)
        hb2 = self._core(h)[:, None, :].expand(n, kc, -1)
        x = torch.cat([hb2, self.emb_algo(a2), self.emb_proto(p2), self.emb_ch(c)], -1)
        f_c = feasible[rows, a2, p2, c]  # [N, kc, K]
        lk = torch.log_softmax(self._mask(self.head_chunk(x), f_c), -1)
        k_n = self.heads.chunk
        score3 = (lp2[:, :, None] + lk).reshape(n, -1)
        ok = torch.cat([f_c.reshape(n, -1)], -1) & torch.isfinite(score3) & (score3 > NEG_INF / 2)
        score3 = score3.masked_fill(~ok, float("-inf"))
        kk = min(k, score3.shape[1])
        lp3, top3 = _topk(score3, kk)
        bi, ck = top3 // k_n, top3 % k_n
        acts = torch.stack([a2.gather(1, bi), p2.gather(1, bi), c.gather(1, bi), ck], -1)
        return acts, lp3

    def joint_log_probs(self, h: Tensor, feasible: Tensor) -> Tensor:
        """Log-probability of every joint action: h [N, hidden] -> [N, A, P, C, K].

        Infeasible actions get -inf. Used to rank candidates for the table.
        """
        a_n, p_n, c_n, _ = self.heads.as_tuple()
        n = h.shape[0]
        f = feasible
        la = torch.log_softmax(self._mask(self._algo_logits(h), f.flatten(2).any(-1)), -1)
        ea = self.emb_algo(torch.arange(a_n))  # [A, E]
        ep = self.emb_proto(torch.arange(p_n))
        ec = self.emb_ch(torch.arange(c_n))
        hx = h[:, None, :].expand(n, a_n, -1)
        lp = torch.log_softmax(
            self._mask(self._proto_logits(hx, ea[None].expand(n, -1, -1)), f.flatten(3).any(-1)),
            -1,
        )
        h = self._core(h)
        shape = (n, a_n, p_n, -1)
        x = torch.cat(
            [
                h[:, None, None, :].expand(*shape),
                ea[None, :, None, :].expand(*shape),
                ep[None, None, :, :].expand(*shape),
            ],
            -1,
        )
        lc = torch.log_softmax(self._mask(self.head_ch(x), f.any(-1)), -1)  # [N, A, P, C]
        shape5 = (n, a_n, p_n, c_n, -1)
        x = torch.cat(
            [
                h[:, None, None, None, :].expand(*shape5),
                ea[None, :, None, None, :].expand(*shape5),
                ep[None, None, :, None, :].expand(*shape5),
                ec[None, None, None, :, :].expand(*shape5),
            ],
            -1,
        )
        lk = torch.log_softmax(self._mask(self.head_chunk(x), f), -1)  # [N, A, P, C, K]
        joint = la[:, :, None, None, None] + lp[:, :, :, None, None] + lc[:, :, :, :, None] + lk
        return torch.where(f, joint, torch.full_like(joint, float("-inf")))

    @staticmethod
    def _mask(logits: Tensor, mask: Tensor) -> Tensor:
        return logits.masked_fill(~mask, NEG_INF)

    @staticmethod
    def _choose(
        logits: Tensor,
        actions: Tensor | None,
        i: int,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> Tensor:
        if actions is not None:
            return actions[..., i]
        if greedy:
            return logits.argmax(-1)
        probs = torch.softmax(logits, -1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    @staticmethod
    def _logp_ent(logits: Tensor, chosen: Tensor) -> tuple[Tensor, Tensor]:
        logp_all = torch.log_softmax(logits, -1)
        probs = logp_all.exp()
        ent = -(probs * logp_all).sum(-1)
        return logp_all.gather(-1, chosen.unsqueeze(-1)).squeeze(-1), ent


def _topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest along the last axis, best first; among equal values the lower index
    first. (`Tensor.topk` orders ties as its partial sort happens to leave them; far down
    a beam, float32 sums often tie exactly. `numpy_policy` breaks ties the same way.)"""
    values, idx = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], idx[..., :k]


def build(config: dict[str, Any]) -> PolicyNet:
    """A PolicyNet from `PolicyNet.config()` output."""
    heads = HeadSizes(*config["heads"])
    offsets = config.get("pick_offsets")
    return PolicyNet(
        int(config["obs_dim"]),
        heads,
        int(config["hidden"]),
        int(config["emb"]),
        (int(offsets[0]), int(offsets[1])) if offsets else None,
    )

"""The policy network's decision-time math in numpy, arranged for speed.

`model.PolicyNet` at a fresh LSTM state (no previous action, previous reward
0), with the weights rearranged once at load so a batch needs no
concatenation:

- the encoder's first layer keeps only its observation columns (the previous
  action and reward inputs are zero);
- the LSTM computes only its input, cell and output gates (h0 = c0 = 0: the
  forget gate and W_hh drop out);
- every head is a linear map of `concat(core, emb_algo[a], emb_proto[p],
  emb_ch[c])`, which splits into `core @ W_core` (one matmul for all heads,
  per row) plus per-option tables `emb @ W_emb` (a gather per row and choice).

Summation order differs from torch's by float32 rounding only; the decisions
and probabilities are compared with torch's in tests/unit/policy/runtime/test_numpy_policy.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from dynamiccl.policy.runtime.heads import NEG_INF, HeadSizes

F32 = NDArray[np.float32]
I64 = NDArray[np.int64]
B8 = NDArray[np.bool_]
_MASKED = np.float32(NEG_INF)


def log_softmax(x: F32) -> F32:
    s: F32 = x - max_last(x)[..., None]
    s -= np.log(sum_last(np.exp(s)))[..., None]
    return s


def sum_last(x: F32) -> F32:
    """`x.sum(-1)`, bit for bit, fast for short last axes: numpy adds up to 7 values in
    turn from 0, and 8 to 15 as ((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7)), then the rest in turn
    (its pairwise sum; test_numpy_net checks the two agree); slice by slice here."""
    n = x.shape[-1]
    if n >= 16 or n == 0:
        out: F32 = x.sum(-1)
        return out
    if n < 8:
        s: F32 = x[..., 0] + np.float32(0.0)
        for i in range(1, n):
            s += x[..., i]
        return s
    r = [x[..., i] for i in range(8)]
    s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for i in range(8, n):
        s += x[..., i]
    return s


def max_last(x: F32) -> F32:
    """`x.max(-1)`, fast for short last axes (slice by slice; the maximum is exact, only a
    zero's sign may differ, which log_softmax's results do not depend on)."""
    if x.shape[-1] > 16:
        out: F32 = x.max(-1)
        return out
    m: F32 = x[..., 0].copy()
    for i in range(1, x.shape[-1]):
        np.maximum(m, x[..., i], out=m)
    return m


def mask(logits: F32, allowed: B8 | np.bool_) -> F32:
    out: F32 = np.where(allowed, logits, _MASKED)
    return out


def any_last(x: B8) -> B8:
    """`x.any(-1)`, fast for short last axes (numpy reduces each row's few values in turn):
    8 booleans are one 64-bit word, other lengths are or-ed slice by slice."""
    if x.shape[-1] == 8 and x.flags.c_contiguous:
        word: B8 = x.view(np.uint64)[..., 0] != 0
        return word
    out: B8 = x[..., 0].copy()
    for i in range(1, x.shape[-1]):
        out |= x[..., i]
    return out


def _sigmoid(x: F32) -> F32:
    """1 / (1 + exp(-x)), in one new array."""
    out: F32 = np.negative(x)
    np.exp(out, out=out)
    out += np.float32(1.0)
    np.divide(np.float32(1.0), out, out=out)
    return out


def _tanh_of(y: F32, bias: F32) -> F32:
    """tanh(y + bias), in place of `y`."""
    y += bias
    out: F32 = np.tanh(y, out=y)
    return out


class Feasible(NamedTuple):
    """A batch's joint feasibility [N, A, P, C, K] and each head's mask given the earlier
    choices, [N, A], [N, A, P], [N, A, P, C] (a choice is allowed iff some completion is
    feasible): reduced once per decision, shared by all its steps."""

    full: B8
    a: B8
    ap: B8
    apc: B8

    @classmethod
    def of(cls, feasible: B8) -> Feasible:
        apc = any_last(feasible)
        ap = any_last(apc)
        return cls(feasible, any_last(ap), ap, apc)

    def rows(self, idx: I64) -> Feasible:
        """The same masks for a subset of the rows."""
        return Feasible(self.full[idx], self.a[idx], self.ap[idx], self.apc[idx])


class Trunk(NamedTuple):
    """A batch's trunk output: each head's share of the core's contribution, NCCL's pick."""

    core: F32  # [N, hidden]
    algo: F32  # [N, A] the algorithm logits (bias and NCCL's pick included)
    proto: F32  # [N, P] head_proto(core) + pick_gain * NCCL's protocol one-hot
    ch: F32  # [N, C] head_ch's core part
    chunk: F32  # [N, K] head_chunk's core part


class Net:
    """The rearranged weights of one network (see the module docstring)."""

    def __init__(self, w: Mapping[str, NDArray[Any]], heads: HeadSizes, hidden: int) -> None:
        def f32(x: NDArray[Any]) -> F32:
            return np.ascontiguousarray(x, dtype=np.float32)

        h, (a_n, p_n, c_n, _) = hidden, heads.as_tuple()
        self.heads, self.hidden = heads, hidden
        enc0 = w["encoder.0.weight"]
        self.obs_dim = enc0.shape[1] - heads.total - 1
        self.enc0 = f32(enc0[:, : self.obs_dim].T)
        self.enc0_b = f32(w["encoder.0.bias"])
        self.enc2, self.enc2_b = f32(w["encoder.2.weight"].T), f32(w["encoder.2.bias"])
        # PyTorch gate order i, f, g, o
        igo = np.r_[0:h, 2 * h : 4 * h]
        self.lstm = f32(w["lstm.weight_ih_l0"][igo].T)
        self.lstm_b = f32(w["lstm.bias_ih_l0"][igo] + w["lstm.bias_hh_l0"][igo])
        self.post, self.post_b = f32(w["post.0.weight"].T), f32(w["post.0.bias"])
        wp, wc, wk = w["head_proto.weight"], w["head_ch.weight"], w["head_chunk.weight"]
        core_w = [w["head_algo.weight"], wp[:, :h], wc[:, :h], wk[:, :h]]
        self.core_w = f32(np.concatenate(core_w).T)
        self.splits = np.cumsum([a_n, p_n, c_n])
        self.core_b = f32(np.concatenate([w["head_algo.bias"], np.zeros(p_n + c_n + heads.chunk)]))
        self.gain = f32(w["pick_gain"])
        ea, ep, ec = (f32(w[f"emb_{x}.weight"]) for x in ("algo", "proto", "ch"))
        e = ea.shape[1]
        # per-option tables [options, head outputs]; the head's bias rides on the algo table
        self.proto_a = f32(ea @ wp[:, h:].T + w["head_proto.bias"])
        self.ch_a = f32(ea @ wc[:, h : h + e].T + w["head_ch.bias"])
        self.ch_p = f32(ep @ wc[:, h + e :].T)
        self.chunk_a = f32(ea @ wk[:, h : h + e].T + w["head_chunk.bias"])
        self.chunk_p = f32(ep @ wk[:, h + e : h + 2 * e].T)
        self.chunk_c = f32(ec @ wk[:, h + 2 * e :].T)

    def trunk(self, obs: F32, pick_offsets: tuple[int, int] | None) -> Trunk:
        """One step from a zero LSTM state, no previous action, reward 0."""
        x = np.ascontiguousarray(obs, dtype=np.float32)
        h, a_n, p_n = self.hidden, self.heads.algo, self.heads.proto
        # in place where torch's expression would make a temporary (fewer large allocations;
        # the same operations on the same values)
        e = _tanh_of(x @ self.enc0, self.enc0_b)
        e = _tanh_of(e @ self.enc2, self.enc2_b)
        gates = e @ self.lstm  # i, g, o
        gates += self.lstm_b
        c = _sigmoid(gates[:, :h])
        tg = np.tanh(gates[:, h : 2 * h])
        c *= tg  # sigmoid(i) * tanh(g)
        out = _sigmoid(gates[:, 2 * h :])
        out *= np.tanh(c, out=tg)  # sigmoid(o) * tanh(c)
        core = _tanh_of(np.concatenate([e, out], -1) @ self.post, self.post_b)
        heads = core @ self.core_w
        heads += self.core_b
        algo, proto, ch, chunk = np.split(heads, self.splits, -1)
        if pick_offsets is not None:
            oa, op = pick_offsets
            algo = algo + self.gain[0] * x[:, oa : oa + a_n]
            proto = proto + self.gain[1] * x[:, op : op + p_n]
        return Trunk(core, algo, proto, ch, chunk)

    # Head logits given earlier choices; index arrays broadcast against the rows' axes
    # (`lead` expands the trunk's [N, X] to the choices' shape).
    def proto_logits(self, t: Trunk, a: I64, lead: int = 0) -> F32:
        base = t.proto.reshape(t.proto.shape[:1] + (1,) * lead + t.proto.shape[1:])
        out: F32 = base + self.proto_a[a]
        return out

    def ch_logits(self, t: Trunk, a: I64, p: I64, lead: int = 0) -> F32:
        base = t.ch.reshape(t.ch.shape[:1] + (1,) * lead + t.ch.shape[1:])
        out: F32 = base + self.ch_a[a] + self.ch_p[p]
        return out

    def chunk_logits(self, t: Trunk, a: I64, p: I64, c: I64, lead: int = 0) -> F32:
        base = t.chunk.reshape(t.chunk.shape[:1] + (1,) * lead + t.chunk.shape[1:])
        out: F32 = base + self.chunk_a[a] + self.chunk_p[p] + self.chunk_c[c]
        return out

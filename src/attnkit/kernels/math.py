"""``math``: the plain PyTorch implementation, always available.

Every score kind, every mask, weights, dropout, autograd, logit softcapping and attention
sinks. It builds the full (..., Lq, Lk) score
matrix (and, for additive attention, (chunk, Lk, h) tanh tiles), so it is the path for small
inputs, for ``return_weights=True`` and the tests' second opinion, not for long sequences.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.policy.decision import NumericsDecision

ADDITIVE_CHUNK_ELEMENTS = 2**24
"""Most (rows x Lk x h) tanh entries built at once by the additive path."""


def additive_scores(q: Tensor, k: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor) -> Tensor:
    """e_ij = w_v . tanh(W_q q_i + W_k k_j): (..., Lq, Lk), built in query chunks so that at most
    ADDITIVE_CHUNK_ELEMENTS tanh entries per batch element exist at once."""
    qp = q @ w_q.transpose(0, 1)  # (..., Lq, h)
    kp = k @ w_k.transpose(0, 1)  # (..., Lk, h)
    lk, h = kp.shape[-2], kp.shape[-1]
    rows = max(1, ADDITIVE_CHUNK_ELEMENTS // max(1, lk * h))
    parts = []
    for s in range(0, qp.shape[-2], rows):
        t = torch.tanh(qp[..., s : s + rows, None, :] + kp[..., None, :, :])  # (..., r, Lk, h)
        # a product and a last-axis sum, not `t @ w_v`: the matrix-vector kernel sums some rows
        # in another order (AVX-512 tails), and equal tanh rows must give bit-equal scores, since
        # one rounding of a score of 1e30 is ~1e23 and would turn a uniform softmax into one-hot
        parts.append((t * w_v).sum(-1))
    return torch.cat(parts, dim=-2)


def masked_softmax(
    scores: Tensor, allowed: Tensor | None, bias: Tensor | None, sinks: Tensor | None = None
) -> Tensor:
    """Softmax over the last dim with an optional bool mask (True = may attend) and additive
    bias. A row with no allowed key gets all-zero weights (not NaN). ``sinks`` (H,) against
    scores (..., H, Lq, Lk): one more logit per row in the denominator (the weights then sum
    to less than 1; a row with no allowed key still gets 0)."""
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    m = scores.detach().amax(dim=-1, keepdim=True)
    sink = None if sinks is None else sinks.to(scores.dtype)[:, None, None]  # (H, 1, 1)
    if sink is not None:
        m = torch.maximum(m, sink.detach())
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m)
    s = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        s = s + torch.exp(sink - m)
    return e / torch.where(s == 0, torch.ones_like(s), s)


def softcapped(scores: Tensor, softcap: float | None) -> Tensor:
    """c * tanh(scores / c) for ``softcap`` c (``scores`` itself for None)."""
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


class MathBackend(Backend):
    name = "math"
    kinds = ("dot", "additive")
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    devices = ("cpu", "cuda", "mps")
    supports_weights = True
    supports_dropout = True
    supports_softcap = True
    supports_sinks = True

    def run(self, call: AttentionCall, decision: NumericsDecision) -> tuple[Tensor, Tensor | None]:
        return plain_attention(call, decision.compute)


def plain_attention(call: AttentionCall, compute: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """The whole call in ``compute`` (P4: float32 for half types; P5: float64 when the dot
    scores could overflow), rounded once to the call's dtype."""
    q, k, v = (t.to(compute) for t in (call.q, call.k, call.v))
    if call.kind == "dot":
        scores = (q @ k.transpose(-2, -1)) * call.scale
    else:
        w_q, w_k, w_v = (t.to(compute) for t in (call.w_q, call.w_k, call.w_v))
        scores = additive_scores(q, k, w_q, w_k, w_v)
    scores = softcapped(scores, call.softcap)
    allowed, bias = call.dense_mask(compute)
    w = masked_softmax(scores, allowed, bias, call.sinks)
    wd = torch.nn.functional.dropout(w, call.dropout_p) if call.dropout_p > 0 else w
    out = (wd @ v).to(call.dtype)
    return out, (w.to(call.dtype) if call.return_weights else None)

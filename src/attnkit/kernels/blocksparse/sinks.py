"""Attention sinks and logit softcapping in the ``blocksparse`` backend: the per-row arithmetic.

Sinks. Every query row of a plan is computed by exactly one tile (one fused call or one explicit
tile over the key range that covers the row's non-empty blocks), so a sink is applied exactly
after the fact from the tile's log-sum-exp: with l = logsumexp of the row's scores and s the
head's sink logit, l' = logaddexp(l, s) is the log-denominator with the sink and the output is
o' = o * exp(l - l') (:func:`sink_forward`). The backward is the plain attention backward run
with (o', l'): it recomputes P' = exp(scores - l'), the probabilities with the sink, and
rowsum(dO * o'), so PyTorch's fused backward needs no change; the sink's own gradient is
-exp(s - l') * rowsum(dO * o') per row (:func:`sink_grad`), summed over rows by autograd.

Softcapping. Band masks in float32 without dropout take the fused softcap path
(:mod:`~attnkit.kernels.blocksparse.softcap`). Otherwise the fused SDPA kernel has no hook
between q kᵀ and the softmax, so calls with ``softcap`` run as explicit tiles
(:mod:`~attnkit.kernels.blocksparse.dropout`, also with p = 0): the scaled scores are capped
in place (:func:`cap_scores`), and the backward multiplies dS by 1 - tanh² before dq and dk
(the mask's own gradient is dS itself: the bias is added after the cap).

Shape legend: ``...`` the plan's batch dims, ``n`` rows of a tile, ``m`` keys, ``L`` rows.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sink_forward(o: Tensor, lse: Tensor, sink: Tensor) -> tuple[Tensor, Tensor]:
    """(o' (..., n, d), l' (..., n)): a tile's output and log-sum-exp with the sink logits
    ``sink`` (..., n) joining the denominator."""
    lse2 = torch.logaddexp(lse, sink)
    return o * torch.exp(lse - lse2).unsqueeze(-1).to(o.dtype), lse2


def sink_grad(sink: Tensor, lse: Tensor, d: Tensor) -> Tensor:
    """d loss / d sink per row (..., n): -exp(s - l') * rowsum(dO * o'), ``d`` (..., n) being
    rowsum(dO * o') and ``lse`` the log-sum-exp with the sink (l')."""
    return torch.exp(sink - lse).mul_(d).neg_()


def cap_scores(s: Tensor, softcap: float, grad: bool) -> Tensor | None:
    """Cap in place the scores ``s`` = q kᵀ · scale / c, computed with q scaled by scale / c
    beforehand (one pass over the scores fewer): s <- c * tanh(s); returns 1 - tanh(s)² (the
    derivative, for a backward) when ``grad``, else None."""
    t = s.tanh_()
    dcap = torch.addcmul(torch.ones((), dtype=t.dtype), t, t, value=-1.0) if grad else None
    t.mul_(softcap)
    return dcap

"""Bottom-right causal attention with fewer queries than keys on the CPU (a chunk of a prefill
against its cache), as two fused calls merged by their log-sum-exp, with no mask built.

Query i of Lq attends to keys j <= i + P, P = Lk - Lq: every query sees the P cached keys, and
the last Lq keys form a top-left causal square. torch's ``causal_lower_right`` runs natively in
the CUDA kernels; on the CPU it materialises the (Lq, Lk) mask, which SDPA then reads for every
batch element and head (measured with Lq = 256, Lk = 2,048, 8 heads on a 2-core EPYC: 7.5 ms
quiet, 41 ms while another process copied memory). Here the prefix is one unmasked fused call
and the square one ``is_causal`` call, merged exactly by their log-sum-exps; the backward runs
the fused backward of each part with the merged output and log-sum-exp, which gives each part's
share of dq and its keys' dk, dv (the softmax's normaliser is the merged one).

Shape legend: ``...`` batch dims (B, H), ``Lq`` < ``Lk``, ``d`` widths.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.kernels.fused_cpu import FLASH, FLASH_BWD, unit_rows

__all__ = ["applies", "attend"]


def applies(q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> bool:
    """True when :func:`attend` serves the call: CPU tensors of 4 dims with one batch shape
    (no grouped heads) and one width (the fused CPU ops take one head size), fewer queries than
    keys, no dropout, and this torch has the fused CPU ops."""
    return (
        FLASH is not None
        and FLASH_BWD is not None
        and dropout_p == 0.0
        and q.device.type == "cpu"
        and q.dim() == k.dim() == v.dim() == 4
        and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
        and q.shape[-1] == k.shape[-1] == v.shape[-1]
        and q.shape[-2] < k.shape[-2]
    )


def _forward(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(output (..., Lq, dv), log-sum-exp (..., Lq)) of the two parts, merged."""
    p = k.shape[-2] - q.shape[-2]
    o1, l1 = FLASH(q, k[..., :p, :], v[..., :p, :], 0.0, False, scale=scale)
    o2, l2 = FLASH(q, k[..., p:, :], v[..., p:, :], 0.0, True, scale=scale)
    lse = torch.logaddexp(l1, l2)
    out = o1 * (l1 - lse).exp_()[..., None] + o2 * (l2 - lse).exp_()[..., None]
    return out.to(q.dtype), lse


class _ChunkFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale):
        out, lse = _forward(q, k, v, scale)
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, go):
        q, k, v, out, lse = ctx.saved_tensors
        go = unit_rows(go)
        p = k.shape[-2] - q.shape[-2]
        s = ctx.scale
        a = FLASH_BWD(go, q, k[..., :p, :], v[..., :p, :], out, lse, 0.0, False, scale=s)
        b = FLASH_BWD(go, q, k[..., p:, :], v[..., p:, :], out, lse, 0.0, True, scale=s)
        return a[0] + b[0], torch.cat([a[1], b[1]], -2), torch.cat([a[2], b[2]], -2), None


def attend(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """softmax(q kᵀ · scale + bottom-right causal) v for q (B, H, Lq, d), k (B, H, Lk, d),
    v (B, H, Lk, dv) with Lq < Lk (:func:`applies`) -> (B, H, Lq, dv)."""
    q, k, v = unit_rows(q), unit_rows(k), unit_rows(v)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _ChunkFn.apply(q, k, v, scale)
    return _forward(q, k, v, scale)[0]

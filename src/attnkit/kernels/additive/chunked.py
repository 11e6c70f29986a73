"""``additive_chunked``: additive attention in plain torch with O(L*h) memory, for any device.

e_ij = w_v . tanh(qp_i + kp_j) (+ bias_ij) with qp = q W_qᵀ, kp = k W_kᵀ (torch's autograd gives
their gradients); out = softmax_j(e) v over the allowed keys. The score matrix and the
(Lq, Lk, h) tanh tensor are never built: the keys are read in chunks of CHUNK_KEYS with an
online softmax (running max m, sum l, accumulator), the queries in as many rows as keep one
(rows x keys x h) tanh tile under TILE_ENTRIES; the backward recomputes each tile from the
saved row max and sum (FlashAttention's scheme): dS = P (dP - rowsum(dO * O)), and through the
tanh layer dqp_i = sum_j dS_ij w_v (1 - t_ij^2), dkp_j likewise, dw_v = sum dS_ij t_ij.

It is the GPU route of additive attention (``additive_fused`` is numba, CPU only): every tensor
is made on the inputs' device, and nothing is read back to the host. Mask tiles are cut from a
tensor mask where it lives, or built by the mask object per tile (bool or bias, a few rows by a
chunk of keys). A row with no allowed key gives 0 (P1). Compute dtype: the policy's decision
(float32 for half types, float64 when P5 asks on the host path). A learned bias (a float mask
that requires grad) goes to ``math``, which differentiates it.

Shape legend: ``...`` batch dims, ``Lq``/``Lk`` lengths, ``h`` hidden width, ``dv`` value width.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall, lift_mask_tensor
from attnkit.kernels.policy.decision import NumericsDecision
from attnkit.masks import TensorMask

__all__ = ["CHUNK_KEYS", "TILE_ENTRIES", "AdditiveChunkedBackend", "additive_chunked"]

CHUNK_KEYS = 256
"""Keys per chunk of the online softmax."""

TILE_ENTRIES = 2**24
"""Most entries of one (batch x rows x keys x h) tanh tile (64 MiB in float32)."""

Tiles = Callable[[int, int, int, int], tuple[Tensor | None, Tensor | None]]
"""(r0, r1, k0, k1) -> (allowed, bias) of that tile, broadcastable to (..., r1-r0, k1-k0)."""


def mask_tiles(call: AttentionCall, dtype: torch.dtype) -> Tiles:
    """The tile function of ``call``'s mask, on the call's device, bias in ``dtype``."""
    mask, lq, lk = call.mask, call.q_len, call.kv_len
    nb, dev = len(call.batch_shape), call.q.device
    if mask is None:
        return lambda r0, r1, k0, k1: (None, None)
    mb = len(mask.batch_shape)
    if type(mask) is TensorMask and mask.t.device == dev:
        t = mask.t

        def cut(r0: int, r1: int, k0: int, k1: int):
            s = lift_mask_tensor(t[..., r0:r1, k0:k1], mb, nb)
            if s.dtype == torch.bool:
                return s, None
            ok = s != -math.inf
            big = torch.finfo(dtype).max
            return ok, torch.where(ok, s, 0).to(dtype).clamp(-big, big)  # s may be narrower

        return cut

    def build(r0: int, r1: int, k0: int, k1: int):
        a = lift_mask_tensor(mask.tile(r0, r1, k0, k1, lq, lk), mb, nb).to(dev)
        b = mask.bias_tile(r0, r1, k0, k1, lq, lk, dtype) if mask.has_bias else None
        return a, (None if b is None else lift_mask_tensor(b, mb, nb).to(dev))

    return build


def _scores(qp: Tensor, kp: Tensor, w_v: Tensor, allowed, bias) -> tuple[Tensor, Tensor]:
    """(tanh tile (..., R, C, h), masked scores (..., R, C))."""
    t = torch.tanh(qp[..., :, None, :] + kp[..., None, :, :])
    s = (t * w_v).sum(-1)
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    return t, s


def _rows(qp: Tensor, kp: Tensor) -> int:
    """Query rows per tile."""
    batch = math.prod(qp.shape[:-2])
    return max(1, TILE_ENTRIES // max(1, batch * min(CHUNK_KEYS, kp.shape[-2]) * qp.shape[-1]))


class ChunkedFn(torch.autograd.Function):
    """out = softmax(w_v . tanh(qp_i + kp_j) + bias, masked) v, tiled (module docstring)."""

    @staticmethod
    def forward(ctx, qp: Tensor, kp: Tensor, v: Tensor, w_v: Tensor, tiles: Tiles) -> Tensor:
        lq, lk = qp.shape[-2], kp.shape[-2]
        rows = _rows(qp, kp)
        outs, ms, linvs = [], [], []
        for r0 in range(0, lq, rows):
            r1 = min(lq, r0 + rows)
            q_r = qp[..., r0:r1, :]
            m = torch.full(q_r.shape[:-1] + (1,), -math.inf, dtype=qp.dtype, device=qp.device)
            l = torch.zeros_like(m)  # noqa: E741 (the softmax's sum, as in the papers)
            acc = torch.zeros(q_r.shape[:-1] + (v.shape[-1],), dtype=v.dtype, device=v.device)
            for k0 in range(0, lk, CHUNK_KEYS):
                k1 = min(lk, k0 + CHUNK_KEYS)
                _, s = _scores(q_r, kp[..., k0:k1, :], w_v, *tiles(r0, r1, k0, k1))
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                safe = torch.where(torch.isfinite(m_new), m_new, 0)
                p = torch.exp(s - safe)
                corr = torch.exp(m - safe)
                l = l * corr + p.sum(-1, keepdim=True)  # noqa: E741
                acc = acc * corr + p @ v[..., k0:k1, :]
                m = m_new
            empty = l == 0  # no allowed key (P1): output 0, and P = 0 in the backward
            linv = torch.where(empty, 0, 1 / torch.where(empty, 1, l))
            outs.append(acc * linv)
            ms.append(torch.where(empty, 0, m))
            linvs.append(linv)
        # the row max and 1 / sum, not their log-sum-exp: m + log(l) loses log(l) when |m| is
        # huge (a bias of -1e38 in float64), and P = exp(s - m) / l keeps it
        out, m, linv = torch.cat(outs, -2), torch.cat(ms, -2), torch.cat(linvs, -2)
        ctx.save_for_backward(qp, kp, v, w_v, out, m, linv)
        ctx.tiles = tiles
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor):
        qp, kp, v, w_v, out, m, linv = ctx.saved_tensors
        lq, lk = qp.shape[-2], kp.shape[-2]
        rows = _rows(qp, kp)
        d_out = d_out.to(out.dtype)
        big_d = (d_out * out).sum(-1, keepdim=True)  # rowsum(dO * O)
        dqp, dkp, dv = torch.zeros_like(qp), torch.zeros_like(kp), torch.zeros_like(v)
        dwv = torch.zeros_like(w_v)
        for r0 in range(0, lq, rows):
            r1 = min(lq, r0 + rows)
            q_r, do_r = qp[..., r0:r1, :], d_out[..., r0:r1, :]
            for k0 in range(0, lk, CHUNK_KEYS):
                k1 = min(lk, k0 + CHUNK_KEYS)
                t, s = _scores(q_r, kp[..., k0:k1, :], w_v, *ctx.tiles(r0, r1, k0, k1))
                p = torch.exp(s - m[..., r0:r1, :]) * linv[..., r0:r1, :]
                dv[..., k0:k1, :] += p.transpose(-2, -1) @ do_r
                ds = p * (do_r @ v[..., k0:k1, :].transpose(-2, -1) - big_d[..., r0:r1, :])
                dwv += (ds[..., None] * t).reshape(-1, t.shape[-1]).sum(0)
                g = ds[..., None] * (1 - t * t) * w_v  # d score / d (qp_i + kp_j)
                dqp[..., r0:r1, :] += g.sum(-2)
                dkp[..., k0:k1, :] += g.sum(-3)
        return dqp, dkp, dv, dwv, None


def additive_chunked(call: AttentionCall, compute: torch.dtype) -> Tensor:
    """Output (..., Lq, dv) of an additive call in ``compute``, differentiable in q, k, v,
    w_q, w_k, w_v (module docstring)."""
    q, k, v = (t.to(compute) for t in (call.q, call.k, call.v))
    w_q, w_k, w_v = (t.to(compute) for t in (call.w_q, call.w_k, call.w_v))
    qp = q @ w_q.transpose(0, 1)  # (..., Lq, h)
    kp = k @ w_k.transpose(0, 1)  # (..., Lk, h)
    return ChunkedFn.apply(qp, kp, v, w_v, mask_tiles(call, compute))


class AdditiveChunkedBackend(Backend):
    """Additive attention in chunks of keys, O(L*h) memory, any device (module docstring)."""

    name = "additive_chunked"
    kinds = ("additive",)
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    devices = ("cpu", "cuda", "mps")
    supports_grad = True
    supports_weights = False
    supports_dropout = False
    supports_bias = True
    fallback = "math"

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if call.bias_needs_grad:
            return ["a learned bias (a float mask that requires grad): math differentiates it"]
        return []

    def speed_reasons(self, call: AttentionCall) -> list[str]:
        if call.q.device.type == "cpu":
            return ["on the CPU, additive_fused (numba) and math are faster"]
        return []

    def run(self, call: AttentionCall, decision: NumericsDecision) -> tuple[Tensor, None]:
        return additive_chunked(call, decision.compute), None

"""Shared helpers of the cases ported from peers' suites (``tests/peers/``): inputs, the
float64 softmax reference and the tolerance check (float64 1e-10, float32 1e-5)."""

from __future__ import annotations

import math

import torch

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def rand(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=dtype)


def qkv(b, h, lq, lk, d, dv=None, dtype=torch.float64, seed=0):
    dv = d if dv is None else dv
    return (
        rand(b, h, lq, d, dtype=dtype, seed=seed),
        rand(b, h, lk, d, dtype=dtype, seed=seed + 1),
        rand(b, h, lk, dv, dtype=dtype, seed=seed + 2),
    )


def ref(q, k, v, allowed=None, bias=None, scale=None):
    """float64 softmax(q k^T scale + bias) v; rows with no allowed key give 0 (attnkit P1)."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q64 @ k64.transpose(-2, -1) * s
    if bias is not None:
        scores = scores + bias.double()
    if allowed is None:
        allowed = torch.ones_like(scores, dtype=torch.bool)
    allowed = allowed & (scores != -math.inf)
    allowed = allowed.expand(scores.shape)
    scores = scores.masked_fill(~allowed, -math.inf)
    w = torch.softmax(scores, -1)
    w = torch.where(allowed.any(-1, keepdim=True), w, torch.zeros_like(w))
    return w @ v64, w


def close(got, want, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


MASK_SHAPES = [
    lambda b, h, lq, lk: (b, 1, 1, lk),
    lambda b, h, lq, lk: (1, 1, lq, lk),
    lambda b, h, lq, lk: (lq, lk),
    lambda b, h, lq, lk: (1, lk),
    lambda b, h, lq, lk: (b, h, lq, lk),
    lambda b, h, lq, lk: (1, h, 1, lk),
    lambda b, h, lq, lk: (b, 1, lq, 1),
]


def block_diag(q_seqlens, kv_seqlens, causal=None):
    lq, lk = sum(q_seqlens), sum(kv_seqlens)
    m = torch.zeros(lq, lk, dtype=torch.bool)
    q0 = k0 = 0
    for a, b in zip(q_seqlens, kv_seqlens):
        blk = torch.ones(a, b, dtype=torch.bool)
        if causal == "top_left":
            blk = blk.tril()
        elif causal == "bottom_right":
            blk = blk.tril(diagonal=b - a)
        m[q0 : q0 + a, k0 : k0 + b] = blk
        q0, k0 = q0 + a, k0 + b
    return m


def ids(seqlens):
    return torch.cat([torch.full((n,), i) for i, n in enumerate(seqlens)])

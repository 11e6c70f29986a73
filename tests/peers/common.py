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

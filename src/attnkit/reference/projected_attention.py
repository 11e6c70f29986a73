"""Attention of projected inputs: self-attention (seeds 000, 002) and multi-head attention
(seed 001), both scaled dot-product attention after the projections Q = X W^Q, K = X W^K,
V = X W^V (X @ W layout: a word's embedding is a row of X)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from attnkit import checks
from attnkit.reference.dot_product_attention import scaled_dot_product
from attnkit.reference.inputs import as_float_array, as_matrix_batch, check_weight, mask_arrays
from attnkit.reference.traces import MultiHeadTrace, SelfAttentionTrace, Trace

__all__ = ["multi_head", "self_attention"]


def self_attention(
    X: object, W_q: object, W_k: object, W_v: object, mask: object = None
) -> SelfAttentionTrace:
    """Self-attention (seeds 000 and 002): Q = X W^Q, K = X W^K, V = X W^V, then
    softmax(Q Kᵀ / sqrt(d_k) + M) V.

    Seed layout: a word's embedding is a row of X and its query is that row times W^Q.

    Args:
        X: (..., L, d_model); W_q: (d_model, d_k); W_k: (d_model, d_k); W_v: (d_model, d_v).
        mask: broadcastable to (..., L, L), as in :func:`~attnkit.reference.scaled_dot_product`.
    Returns:
        :class:`SelfAttentionTrace`; ``output`` (..., L, d_v).
    """
    x = as_matrix_batch("X", X, "(..., L, d_model)")
    d_model = x.shape[-1]
    wq = as_float_array("W_q", W_q)
    if wq.ndim != 2 or wq.shape[0] != d_model or wq.shape[1] < 1:
        raise ValueError(
            f"W_q: expected shape (d_model, d_k) with d_model = {d_model}, got {wq.shape}"
        )
    d_k = wq.shape[1]
    wk = check_weight("W_k", W_k, (d_model, d_k), "(d_model, d_k)")
    wv = as_float_array("W_v", W_v)
    if wv.ndim != 2 or wv.shape[0] != d_model or wv.shape[1] < 1:
        raise ValueError(
            f"W_v: expected shape (d_model, d_v) with d_model = {d_model}, got {wv.shape}"
        )
    t = scaled_dot_product(x @ wq, x @ wk, x @ wv, mask)
    return SelfAttentionTrace(**{f.name: getattr(t, f.name) for f in fields(t)}, x=x)


def multi_head(
    X_q: object,
    X_kv: object,
    W_q: object,
    W_k: object,
    W_v: object,
    W_o: object,
    num_heads: int,
    mask: object = None,
) -> MultiHeadTrace:
    """MultiHead = Concat(head_1, ..., head_H) W^O, head_i = Attention(X_q W^Q_i, X_kv W^K_i,
    X_kv W^V_i) with scaled dot-product attention (seed 001; self-attention when X_q is X_kv).

    The per-head projections are the column blocks of the stacked matrices (X @ W layout):
    W^Q_i = W_q[:, i*d_k:(i+1)*d_k], and likewise W^K_i, W^V_i (d_v columns each).

    Args:
        X_q: (..., Lq, d_model); X_kv: (..., Lk, d_kv) with the same batch dims.
        W_q: (d_model, H*d_k); W_k: (d_kv, H*d_k); W_v: (d_kv, H*d_v); W_o: (H*d_v, d_out).
        num_heads: H.
        mask: broadcastable to (..., H, Lq, Lk) (right-aligned: (Lq, Lk) applies to every head
            and batch element, (H, Lq, Lk) per head, (B, 1, Lq, Lk) per batch element).
    Returns:
        :class:`MultiHeadTrace`; ``output`` (..., Lq, d_out), ``weights`` (..., H, Lq, Lk).
    """
    xq = as_matrix_batch("X_q", X_q, "(..., Lq, d_model)")
    xkv = as_matrix_batch("X_kv", X_kv, "(..., Lk, d_kv)")
    if xkv.shape[:-2] != xq.shape[:-2]:
        raise ValueError(f"X_kv: expected batch dims {xq.shape[:-2]} like X_q, got {xkv.shape}")
    H = checks.positive_int("num_heads", num_heads)
    mats = {}
    for name, w, rows, what in (
        ("W_q", W_q, xq.shape[-1], "(d_model, H*d_k)"),
        ("W_k", W_k, xkv.shape[-1], "(d_kv, H*d_k)"),
        ("W_v", W_v, xkv.shape[-1], "(d_kv, H*d_v)"),
    ):
        a = as_float_array(name, w)
        if a.ndim != 2 or a.shape[0] != rows or a.shape[1] < H or a.shape[1] % H:
            raise ValueError(
                f"{name}: expected shape {what} with {rows} rows and columns a multiple of "
                f"num_heads = {H}, got {a.shape}"
            )
        mats[name] = a
    wq, wk, wv = mats["W_q"], mats["W_k"], mats["W_v"]
    d_k, d_v = wq.shape[1] // H, wv.shape[1] // H
    if wk.shape[1] != H * d_k:
        raise ValueError(f"W_k: expected {H * d_k} columns (H*d_k) like W_q, got {wk.shape}")
    wo = as_float_array("W_o", W_o)
    if wo.ndim != 2 or wo.shape[0] != H * d_v or wo.shape[1] < 1:
        raise ValueError(
            f"W_o: expected shape (H*d_v, d_out) with H*d_v = {H * d_v}, got {wo.shape}"
        )
    batch, lq, lk = xq.shape[:-2], xq.shape[-2], xkv.shape[-2]
    allowed, bias = mask_arrays(mask, batch + (H, lq, lk))
    head_mask = np.where(allowed, bias, -np.inf)  # one float mask carries both parts
    heads = []
    for i in range(H):
        qi = xq @ wq[:, i * d_k : (i + 1) * d_k]
        ki = xkv @ wk[:, i * d_k : (i + 1) * d_k]
        vi = xkv @ wv[:, i * d_v : (i + 1) * d_v]
        heads.append(scaled_dot_product(qi, ki, vi, head_mask[..., i, :, :]))
    concat = np.concatenate([t.output for t in heads], axis=-1)  # (..., Lq, H*d_v)
    output = concat @ wo
    stacked = {
        f.name: np.stack([getattr(t, f.name) for t in heads], axis=-3)
        for f in fields(Trace)
        if f.name not in ("scale", "output")
    }
    return MultiHeadTrace(
        **stacked,
        scale=heads[0].scale,
        output=output,
        heads=tuple(heads),
        concat=concat,
    )

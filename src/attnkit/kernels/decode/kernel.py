"""The decode step: a few query rows against a long key/value cache, K and V read once.

For q (..., H, Lq, dk) and k, v (..., G, Lk, d) with G dividing H (G = H without grouping), the
g = H / G query heads of each key/value head are folded into the rows of one matrix product, so
a grouped cache is read once for all its query heads and never repeated::

    qg = q.reshape(..., G, g * Lq, dk) * scale
    s  = qg @ k[..., keys, :]ᵀ                         # (..., G, g*Lq, n): one read of K
    s[not allowed] = -inf; p = softmax(s)              # (..., G, g*Lq, n): small (Lq <= 16)
    out = p @ v[..., keys, :]                          # one read of V

``keys`` is the range of keys the mask can allow (:mod:`.keys`): a sliding window reads only its
window. On torch ops (float32), both products run on torch's threads as its batched matrix
products share them out; with the scores materialised, a softmax over the whole row replaces the
combination of partial softmaxes. When the mask allows every key of the range, the step can
instead run on the numba split-K kernel (:mod:`.split_k`: flash-decoding's partial softmaxes
over key splits on every thread, then one combine); bfloat16 always does (a bf16 step whose mask
needs a tile returns None: the caller redoes it exactly), float32 from the tuned crossover.

The overflow policy (:mod:`attnkit.kernels.policy.numerics`, P5/P6) is checked on what the step
reads, inside the same pass, not by a separate scan of the cache: the scores are accepted only when
every one of them is finite and below ``finfo(float32).max / OVERFLOW_MARGIN`` (the bound P5
protects), and the output only when it is finite (a NaN or inf in V reaches it). Otherwise
:func:`attend` returns None and the caller redoes the call the exact way. A step whose scores
are all inside the bound stays in float32 even where the policy's cheaper a-priori bound
(max|q| max|k| d scale) would have chosen float64: the scores themselves show that nothing
overflowed. A row with no allowed key gives 0 (P1).

Shape legend: ``...`` leading batch dims, ``H``/``G`` query/key-value heads, ``g = H / G``,
``Lq``/``Lk`` lengths, ``n`` keys in range, ``dk``/``dv`` widths.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.kernels.decode.keys import KeyRange, allowed_tile, key_range
from attnkit.kernels.decode.split_k import attend_split_k
from attnkit.kernels.policy.numerics import OVERFLOW_MARGIN
from attnkit.masks import Mask

__all__ = ["SCORE_LIMIT", "attend"]

SCORE_LIMIT = torch.finfo(torch.float32).max / OVERFLOW_MARGIN
"""Largest |score| a float32 decode step accepts (policy P5's bound, applied to the scores)."""


_ZERO = torch.zeros((1, 1, 1))


def _grouped_mask(allowed: Tensor, batch: tuple[int, ...], groups: int) -> Tensor:
    """mb + (Lq, n) -> broadcastable to batch[:-1] + (G, g, Lq, n)."""
    nb = len(batch)
    extra = nb - (allowed.dim() - 2)
    a = allowed.reshape(allowed.shape[:-2] + (1,) * extra + allowed.shape[-2:])
    heads = a.shape[nb - 1]
    split = (groups, heads // groups) if heads > 1 else (1, 1)
    return a.reshape(a.shape[: nb - 1] + split + a.shape[-2:])


def _compact_heads(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """k, v with an expanded head dim (stride 0 in both) narrowed to one head."""
    if k.shape[-3] > 1 and k.stride(-3) == 0 and v.stride(-3) == 0:
        return k.narrow(-3, 0, 1), v.narrow(-3, 0, 1)
    return k, v


def _flat(x: Tensor) -> Tensor:
    """(..., n, d) -> (N, n, d): a view when the leading dims merge (contiguous tensors, slices
    of a cache buffer), else a copy (torch's 4-d matmul is far slower than bmm at Lq = 1)."""
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, scale: float, split_k: bool = False
) -> tuple[Tensor, KeyRange] | None:
    """(output (..., H, Lq, dv) in q's dtype, the key range read) for q (..., H, Lq, dk),
    k (..., G, Lk, dk), v (..., G, Lk, dv) (G divides H; mask without bias, lined up with q's
    batch dims); None when the scores or the output break the policy (redo the call exactly).

    float32 runs on torch ops, or on the numba split-K kernel (:mod:`.split_k`) when
    ``split_k`` and the mask allows every key of its range; bfloat16 runs only there (None,
    i.e. redo exactly, when the mask needs a tile)."""
    squeeze = q.dim() == 2
    if squeeze:
        q, k, v = q[None], k[None], v[None]
    k, v = _compact_heads(k, v)
    batch, lq, lk = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2]
    heads, groups = batch[-1], k.shape[-3]
    keys = key_range(mask, lq, lk)
    out_shape = batch + (lq, v.shape[-1])
    if keys.empty:  # no row has an allowed key (P1)
        out = q.new_zeros(out_shape)
        return (out[0] if squeeze else out), keys
    if keys.start or keys.stop < lk:
        k, v = k[..., keys.start : keys.stop, :], v[..., keys.start : keys.stop, :]
    g = heads // groups
    n, dv = k.shape[-2], v.shape[-1]
    allowed = allowed_tile(mask, keys, lq, lk)
    if q.dtype != torch.float32 and allowed is not None:
        return None
    if allowed is None and (split_k or q.dtype != torch.float32):
        out = attend_split_k(q, k, v, scale, SCORE_LIMIT)  # q's blocks: (..., G, g*Lq, dk)
        if out is None:
            return None
        out = out.to(q.dtype)
        return (out[0] if squeeze else out), keys
    if not abs(scale) <= torch.finfo(torch.float32).max:  # baddbmm's alpha is a float32
        return None  # redone exactly on the scanned policy's backend
    q3 = q.reshape(-1, g * lq, q.shape[-1])  # (N, g*Lq, dk): the g heads of a group as rows
    k3, v3 = _flat(k), _flat(v)  # (N, n, d): views for contiguous and cache-buffer layouts
    # s = scale * q kᵀ (beta = 0: the input's values are ignored, only its shape broadcasts)
    s = torch.baddbmm(_ZERO, q3, k3.transpose(1, 2), beta=0.0, alpha=scale)  # (N, g*Lq, n)
    lo, hi = torch.aminmax(s)
    row_ok = None
    if allowed is not None:
        a5 = _grouped_mask(allowed, batch, groups)  # (..., G|1, g|1, Lq, n)
        s5 = s.view(batch[:-1] + (groups, g, lq, n))
        s5.masked_fill_(~a5, -math.inf)
        row_ok = a5.any(-1, keepdim=True)
        if bool(row_ok.all()):
            row_ok = None
    out = torch.bmm(torch.softmax(s, dim=-1), v3)  # (N, g*Lq, dv)
    if row_ok is not None:
        out5 = out.view(batch[:-1] + (groups, g, lq, dv))
        out5.masked_fill_(~row_ok, 0.0)
    # one sync: scores inside P5's bound, output finite (a NaN or inf in it reaches its sum)
    lo_f, hi_f, total = torch.stack([lo, hi, out.sum()]).tolist()
    if not (-SCORE_LIMIT < lo_f and hi_f < SCORE_LIMIT and math.isfinite(total)):
        return None
    out = out.reshape(out_shape)
    return (out[0] if squeeze else out), keys

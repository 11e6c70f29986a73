"""``dense``: PyTorch's fused ``scaled_dot_product_attention``.

Dot-product scores; no mask, the top-left causal mask (SDPA's ``is_causal``), or a mask small
enough to materialise (at most DENSE_MASK_LIMIT entries). Rows that a mask leaves without any
key are computed with a harmless mask and then zeroed, so they give 0, not NaN. The NaN/inf
policy of :mod:`attnkit.kernels.numerics` applies: half types keep their bias in float32 (SDPA
computes in float32 for them), overflowing calls run in float64.

Grouped-query calls (k, v with G < H heads) run on SDPA's ``enable_gqa=True``: PyTorch's CPU
flash kernel reads key/value head h // (H / G) for query head h, forward and backward, without
copying k and v. The rare calls that leave the fused path (non-finite inputs, scores too large
for a fused backward) get k and v repeated to H heads first
(:func:`attnkit.kernels.base.ungrouped`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.kernels.base import AttentionCall, Backend, ungrouped
from attnkit.kernels.numerics import fused_backward_ok, numerics, run_dot
from attnkit.kernels.torch_math import plain_attention

DENSE_MASK_LIMIT = 2**26
"""Most entries of a materialised mask the dense backend accepts (64 Mi bools)."""


def is_plain_causal(mask: object) -> bool:
    """True for a top-left causal mask (SDPA's ``is_causal=True``)."""
    if mask is None:
        return False
    v = getattr(mask, "is_plain_causal", None)
    if isinstance(v, bool):
        return v
    return type(mask).__name__ == "causal" and getattr(mask, "alignment", None) == "top_left"


def compact(t: Tensor) -> Tensor:
    """``t`` with every expanded dim but the last (stride 0, e.g. a key padding mask's query
    dim) narrowed to size 1: the same entries, broadcastable to ``t``'s shape, without repeats."""
    out = t
    for dim in range(t.dim() - 1):
        if t.stride(dim) == 0 and t.shape[dim] > 1:
            out = out.narrow(dim, 0, 1)
    return out


def open_empty_rows(allowed: Tensor) -> tuple[Tensor, Tensor | None]:
    """(allowed with every key opened in rows that have none, row_ok (..., n, 1) bool or None
    when every row has a key). Attend with the opened mask, then zero the rows not in row_ok:
    a row with no allowed key gives 0, not NaN (P1). Expanded dims are reduced once
    (:func:`compact`), not once per repeat."""
    row_ok = compact(allowed).any(dim=-1, keepdim=True)
    if bool(row_ok.all()):
        return allowed, None
    row_ok = row_ok.expand(allowed.shape[:-1] + (1,))
    return allowed | ~row_ok, row_ok


def _dense(call: AttentionCall, compute: torch.dtype) -> tuple[Tensor, None]:
    if not fused_backward_ok(call):  # scores too large for SDPA's fused backward, even in float64
        return plain_attention(call, compute)[0], None  # explicit softmax: exact gradients
    q, k, v = call.q, call.k, call.v
    if compute == torch.float64 and q.dtype != torch.float64:  # P5: overflowing scores
        q, k, v = q.double(), k.double(), v.double()
    if call.mask is None and q.shape[:-2] == k.shape[:-2]:  # the common case, kept short
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=call.dropout_p, scale=call.scale
        ), None
    kw = dict(dropout_p=call.dropout_p, scale=call.scale)
    if call.grouped:
        kw["enable_gqa"] = True
    if call.mask is None:
        return F.scaled_dot_product_attention(q, k, v, **kw), None
    if is_plain_causal(call.mask):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw), None
    allowed, bias = call.dense_mask(torch.promote_types(compute, q.dtype))
    allowed, row_ok = open_empty_rows(allowed)
    if bias is None:  # additive 0 / -inf on the distinct entries: SDPA broadcasts it, while a
        # bool mask it would first turn into a float mask of the full (..., Lq, Lk) shape
        a = compact(allowed)
        attn = torch.zeros(a.shape, dtype=q.dtype, device=a.device).masked_fill_(~a, -math.inf)
    else:
        attn = bias.masked_fill(~allowed, -math.inf)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn, **kw)
    if row_ok is not None:
        out = out * row_ok.to(out.dtype)
    return out, None


class DenseBackend(Backend):
    name = "dense"
    kinds = ("dot",)
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    devices = ("cpu", "cuda", "mps")
    supports_dropout = True
    supports_gqa = True

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if call.mask is None or is_plain_causal(call.mask):
            return []
        n = 1
        for s in call.mask.batch_shape:
            n *= s
        n *= call.q_len * call.kv_len
        if n > DENSE_MASK_LIMIT:
            return [f"mask would materialise {n:,} entries (> {DENSE_MASK_LIMIT:,})"]
        return []

    def run(self, call: AttentionCall) -> tuple[Tensor, None]:
        if call.grouped and not (numerics(call)[1] and fused_backward_ok(call)):
            call = ungrouped(call)  # the policy's and the plain-softmax paths need H heads
        return run_dot(call, _dense)

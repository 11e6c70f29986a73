"""``dense``: PyTorch's fused ``scaled_dot_product_attention``.

Dot-product scores; no mask, the causal masks (top-left: SDPA's ``is_causal=True``;
bottom-right with Lq <= Lk: ``torch.nn.attention.bias.causal_lower_right``, native in the CUDA
kernels; on the CPU, where torch would materialise it, :mod:`attnkit.kernels.causal_chunk`'s two
fused calls when Lq < Lk), or a mask small enough to materialise (at most DENSE_MASK_LIMIT entries).
Rows that a mask leaves without any key are computed with a harmless mask and then zeroed, so
they give 0, not NaN (on the policy's device path by a device-side select, without reading
back whether any row is empty). The NaN/inf policy of :mod:`attnkit.kernels.policy.numerics` is
dispatch's stage: half types keep their bias in float32 (SDPA computes in float32 for them),
overflowing calls run in float64; a call whose scores are too large for SDPA's fused backward
is handed to ``math`` (:meth:`DenseBackend.decision_reasons`).

Grouped-query calls (k, v with G < H heads) run on SDPA's ``enable_gqa=True``: PyTorch's CPU
flash kernel reads key/value head h // (H / G) for query head h, forward and backward, without
copying k and v (on CUDA too: decode steps against a long cache take this path, no repeat).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from attnkit.kernels import causal_chunk
from attnkit.kernels.call.backend import Backend, fused_backward_reasons
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.policy.decision import NumericsDecision
from attnkit.masks import Mask

DENSE_MASK_LIMIT = 2**26
"""Most entries of a materialised mask the dense backend accepts (64 Mi bools)."""


def is_causal_exact(scale: float) -> bool:
    """True when SDPA's ``is_causal`` (and ``causal_lower_right``, which becomes it for Lq = Lk)
    is exact at ``scale``: torch's CPU kernel masks the scores before it scales them, so a scale
    that is 0 in float32 (its accumulation type) turns the masked scores into NaN, a negative
    one into +inf."""
    return scale >= torch.finfo(torch.float32).tiny


def causal_alignment(mask: Mask | None) -> str | None:
    """ "top_left" or "bottom_right" when ``mask`` is a plain causal mask (a band lo = -inf,
    hi = 0 without a bias or batch dims), else None."""
    if mask is None or mask.has_bias or mask.batch_shape:
        return None
    band = mask.as_band()
    if band is None or band.lo != -math.inf or band.hi != 0:
        return None
    return band.alignment


def sdpa_causal(call: AttentionCall) -> str | None:
    """How SDPA takes the call's mask without a materialised one: ``"top_left"``
    (``is_causal=True``), ``"bottom_right"`` (``causal_lower_right``, Lq <= Lk: cached decoding,
    chunked prefill), else None. The one test of it, for dense and for the backends that step
    aside for it. None for a scale at which is_causal is not exact (:func:`is_causal_exact`)."""
    mask = call.mask
    if not is_causal_exact(call.scale):
        return None
    if mask is not None and mask.is_plain_causal:  # SDPA's is_causal=True
        return "top_left"
    if call.q_len <= call.kv_len and causal_alignment(mask) == "bottom_right":
        return "bottom_right"
    return None


def compact(t: Tensor) -> Tensor:
    """``t`` with every expanded dim but the last (stride 0, e.g. a key padding mask's query
    dim) narrowed to size 1: the same entries, broadcastable to ``t``'s shape, without repeats."""
    out = t
    for dim in range(t.dim() - 1):
        if t.stride(dim) == 0 and t.shape[dim] > 1:
            out = out.narrow(dim, 0, 1)
    return out


def open_empty_rows(allowed: Tensor, host: bool = True) -> tuple[Tensor, Tensor | None]:
    """(allowed with every key opened in rows that have none, row_ok (..., n, 1) bool or None
    when every row has a key). Attend with the opened mask, then zero the rows not in row_ok:
    a row with no allowed key gives 0, not NaN (P1). Expanded dims are reduced once
    (:func:`compact`), not once per repeat. ``host`` False (the policy's device path): never
    reads back whether every row has a key (row_ok is always returned)."""
    row_ok = compact(allowed).any(dim=-1, keepdim=True)
    if host and bool(row_ok.all()):
        return allowed, None
    row_ok = row_ok.expand(allowed.shape[:-1] + (1,))
    return allowed | ~row_ok, row_ok


def attend(call: AttentionCall, d: NumericsDecision) -> tuple[Tensor, None]:
    """SDPA on the call under the policy's decision ``d`` (compute dtype; device path)."""
    compute = d.compute
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
    how = sdpa_causal(call)
    if how == "top_left":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw), None
    if how == "bottom_right":
        if causal_chunk.applies(q, k, v, call.dropout_p):  # CPU: no (Lq, Lk) mask built
            return causal_chunk.attend(q, k, v, call.scale), None
        bias = causal_lower_right(call.q_len, call.kv_len)  # every row has a key (P1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, **kw), None
    allowed, bias = call.dense_mask(torch.promote_types(compute, q.dtype))
    allowed, row_ok = open_empty_rows(allowed, host=d.checked != "device")
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


def _mask_size_reasons(call: AttentionCall) -> list[str]:
    """Why the call's mask is too large to materialise, if it is (none for the causal masks
    SDPA takes without a materialised mask)."""
    mask = call.mask
    if mask is None or sdpa_causal(call) is not None:
        return []
    n = math.prod(mask.batch_shape) * call.q_len * call.kv_len
    if n > DENSE_MASK_LIMIT:
        return [f"mask would materialise {n:,} entries (> {DENSE_MASK_LIMIT:,})"]
    return []


class DenseBackend(Backend):
    name = "dense"
    kinds = ("dot",)
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    devices = ("cpu", "cuda", "mps")
    supports_dropout = True
    supports_gqa = True
    fallback = "math"

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        return _mask_size_reasons(call)

    def decision_reasons(self, call: AttentionCall, decision: NumericsDecision) -> list[str]:
        return [] if decision.fused_backward_ok else fused_backward_reasons(decision)

    def run(self, call: AttentionCall, decision: NumericsDecision) -> tuple[Tensor, None]:
        return attend(call, decision)

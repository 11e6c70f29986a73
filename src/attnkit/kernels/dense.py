"""``dense``: PyTorch's fused ``scaled_dot_product_attention``.

Dot-product scores; no mask, the top-left causal mask (SDPA's ``is_causal``), or a mask small
enough to materialise (at most DENSE_MASK_LIMIT entries). Rows that a mask leaves without any
key are computed with a harmless mask and then zeroed, so they give 0, not NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.kernels.base import AttentionCall, Backend
from attnkit.masks import causal

DENSE_MASK_LIMIT = 2**26
"""Most entries of a materialised mask the dense backend accepts (64 Mi bools)."""


def _is_plain_causal(call: AttentionCall) -> bool:
    m = call.mask
    return type(m) is causal and m.alignment == "top_left"


class DenseBackend(Backend):
    name = "dense"
    description = "torch SDPA (fused dense kernel)"
    kinds = ("dot",)
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    devices = ("cpu", "cuda", "mps")
    supports_dropout = True

    def extra_reasons(self, call: AttentionCall) -> list[str]:
        if call.mask is None or _is_plain_causal(call):
            return []
        n = 1
        for s in call.mask.batch_shape:
            n *= s
        n *= call.q_len * call.kv_len
        if n > DENSE_MASK_LIMIT:
            return [f"mask would materialise {n:,} entries (> {DENSE_MASK_LIMIT:,})"]
        return []

    def run(self, call: AttentionCall) -> tuple[Tensor, None]:
        q, k, v = call.q, call.k, call.v
        kw = dict(dropout_p=call.dropout_p, scale=call.scale)
        if call.mask is None:
            return F.scaled_dot_product_attention(q, k, v, **kw), None
        if _is_plain_causal(call):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw), None
        allowed, bias = call.dense_mask()
        row_ok = allowed.any(dim=-1, keepdim=True)
        all_rows = bool(row_ok.all())
        if not all_rows:
            allowed = allowed | ~row_ok  # let empty rows attend somewhere finite, zeroed below
        if bias is None:
            attn = allowed
        else:
            attn = bias.masked_fill(~allowed, float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn, **kw)
        if not all_rows:
            out = out * row_ok.to(out.dtype)
        return out, None

"""x-transformers cases: ALiBi slopes and KV-cache decoding equal to the full forward.

Ported from the peer's own suite and checked against torch's own math or an explicit float64
softmax (tests/peers/common.py); where attnkit differs by a documented convention, the test
asserts attnkit's documented behaviour and says so."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.nn import MultiHeadAttention
from tests.peers.common import close, qkv, rand


# ---------------------------------------------------------------------------------------------
# x-transformers: ALiBi (AlibiPositionalBias)
# ---------------------------------------------------------------------------------------------
def xt_slopes(heads):
    # x-transformers AlibiPositionalBias._get_slopes
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return pow2(heads)
    c = 2 ** math.floor(math.log2(heads))
    return pow2(c) + pow2(2 * c)[0::2][: heads - c]


@pytest.mark.parametrize("heads", [1, 2, 6, 8, 12])
def test_alibi_slopes_match_x_transformers(heads):
    got = masks.alibi_slopes(heads)
    torch.testing.assert_close(got, torch.tensor(xt_slopes(heads), dtype=torch.float64))


@pytest.mark.parametrize("lq,lk", [(6, 6), (2, 9)])
def test_alibi_causal_matches_x_transformers(lq, lk):
    # x-transformers: bias = -slope * |j - i| (bottom-right positions), causal decoder
    h = 4
    q, k, v = qkv(2, h, lq, lk, 8)
    slopes = torch.tensor(xt_slopes(h), dtype=torch.float64)
    i = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    bias = -slopes[:, None, None] * (j - i).abs()
    bias = bias.masked_fill(j > i, -math.inf)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    m = masks.ALiBi(masks.alibi_slopes(h)) & masks.causal("bottom_right")
    close(attnkit.scaled_dot_product_attention(q, k, v, m), want, torch.float64)


# ---------------------------------------------------------------------------------------------
# x-transformers test_kv_cache: cached decoding == full forward
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "full_mask,step_mask",
    [
        (masks.causal(), masks.causal("bottom_right")),
        (masks.sliding_window(2, 0), masks.sliding_window(2, 0, alignment="bottom_right")),
    ],
)
def test_kv_cache_matches_full(full_mask, step_mask):
    torch.manual_seed(3)
    m = MultiHeadAttention(16, 4, num_kv_heads=2, dtype=torch.float64).eval()
    x = rand(2, 9, 16)
    full = m(x, mask=full_mask)[0]
    cache = m.new_cache()
    outs = [m(x[:, :4], mask=step_mask, cache=cache)[0]]
    outs += [m(x[:, i : i + 1], mask=step_mask, cache=cache)[0] for i in range(4, 9)]
    close(torch.cat(outs, 1), full, torch.float64)

"""xformers ``tests/test_mem_eff_attention.py`` cases: the attn_bias kinds as attnkit masks.

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
from tests.peers.common import close, qkv, rand, ref
from tests.support.masks import block_diag, ids


# ---------------------------------------------------------------------------------------------
# xformers tests/test_mem_eff_attention.py: attn_bias kinds
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_xformers_lower_triangular(dtype):
    # LowerTriangularMask == causal top-left
    q, k, v = qkv(1, 2, 9, 9, 8, dtype=dtype)
    want, _ = ref(q, k, v, torch.ones(9, 9, dtype=torch.bool).tril())
    close(attnkit.scaled_dot_product_attention(q, k, v, masks.causal()), want, dtype)


@pytest.mark.parametrize("seqlens", [[3, 4, 2], [1, 1, 1], [7], [2, 5, 1, 4]])
def test_xformers_block_diagonal(seqlens):
    # BlockDiagonalMask.from_seqlens == document ids
    n = sum(seqlens)
    q, k, v = qkv(1, 2, n, n, 8)
    want, _ = ref(q, k, v, block_diag(seqlens, seqlens))
    close(
        attnkit.scaled_dot_product_attention(q, k, v, masks.document(ids(seqlens))),
        want,
        torch.float64,
    )


@pytest.mark.parametrize("seqlens", [[3, 4, 2], [1, 6]])
def test_xformers_block_diagonal_causal(seqlens):
    # BlockDiagonalCausalMask == document & causal (top-left within each block)
    n = sum(seqlens)
    q, k, v = qkv(1, 2, n, n, 8)
    want, _ = ref(q, k, v, block_diag(seqlens, seqlens, "top_left"))
    m = masks.document(ids(seqlens)) & masks.causal()
    close(attnkit.scaled_dot_product_attention(q, k, v, m), want, torch.float64)


def test_xformers_block_diagonal_q_ne_kv():
    # BlockDiagonalMask.from_seqlens(q_seqlen, kv_seqlen) with different lengths
    qs, ks = [2, 3, 1], [4, 1, 3]
    q, k, v = qkv(1, 2, sum(qs), sum(ks), 8)
    want, _ = ref(q, k, v, block_diag(qs, ks))
    m = masks.document(ids(qs), ids(ks))
    close(attnkit.scaled_dot_product_attention(q, k, v, m), want, torch.float64)


@pytest.mark.parametrize("lq,lk", [(3, 8), (8, 8), (1, 5), (6, 4)])
def test_xformers_lower_triangular_from_bottom_right(lq, lk):
    # LowerTriangularFromBottomRightMask == causal bottom-right
    q, k, v = qkv(2, 2, lq, lk, 8)
    want, _ = ref(q, k, v, torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq))
    got = attnkit.scaled_dot_product_attention(q, k, v, masks.causal("bottom_right"))
    close(got, want, torch.float64)


@pytest.mark.parametrize(
    "lq,lk,left,right", [(8, 8, 3, 0), (4, 9, 2, 1), (9, 9, 0, 0), (5, 7, 2, 2)]
)
def test_xformers_local_attention_from_bottom_right(lq, lk, left, right):
    # LocalAttentionFromBottomRightMask(window_left, window_right): -left <= j - i' <= right
    # with i' = i + Lk - Lq
    q, k, v = qkv(1, 2, lq, lk, 8)
    i = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    allowed = (j - i >= -left) & (j - i <= right)
    want, _ = ref(q, k, v, allowed)
    m = masks.sliding_window(left, right, alignment="bottom_right")
    close(attnkit.scaled_dot_product_attention(q, k, v, m), want, torch.float64)


@pytest.mark.parametrize("window", [1, 3, 16])
def test_xformers_lower_triangular_local(window):
    # LowerTriangularMask + local window (xformers "local" / Mistral sliding window):
    # i - window < j <= i
    lq = 11
    q, k, v = qkv(1, 1, lq, lq, 8)
    i, j = torch.arange(lq)[:, None], torch.arange(lq)[None, :]
    want, _ = ref(q, k, v, (j <= i) & (j > i - window))
    m = masks.sliding_window(window - 1, 0)
    close(attnkit.scaled_dot_product_attention(q, k, v, m), want, torch.float64)
    close(
        attnkit.scaled_dot_product_attention(
            q, k, v, masks.sliding_window(window - 1) & masks.causal()
        ),
        want,
        torch.float64,
    )


def test_xformers_lower_triangular_with_tensor_bias():
    # LowerTriangularMaskWithTensorBias: causal + additive bias tensor (grad through the bias)
    q, k, v = qkv(2, 2, 6, 6, 4)
    bias = rand(2, 2, 6, 6, seed=4).requires_grad_(True)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    got = attnkit.scaled_dot_product_attention(q, k, v, bias.masked_fill(~allowed, -math.inf))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~allowed, -math.inf))
    close(got, want, torch.float64)
    (g1,) = torch.autograd.grad(got.sum(), bias)
    (g2,) = torch.autograd.grad(want.sum(), bias)
    close(g1, g2, torch.float64)


def test_xformers_batched_block_diagonal_padded_keys():
    # BlockDiagonalPaddedKeysMask-like: per-batch key lengths (KeyPadding) with causal
    q, k, v = qkv(3, 2, 5, 7, 4)
    lengths = [7, 3, 1]
    allowed = torch.zeros(3, 1, 5, 7, dtype=torch.bool)
    for b, n in enumerate(lengths):
        allowed[b, :, :, :n] = True
    want, _ = ref(q, k, v, allowed)
    close(
        attnkit.scaled_dot_product_attention(q, k, v, masks.key_padding(lengths)),
        want,
        torch.float64,
    )

"""More ported cases: a hypothesis property over shapes, masks, layouts and backends; PyTorch
regressions (fp16 overflow, pytorch#160841; scale=-1e4, pytorch#105190); xformers'
BlockDiagonalCausalLocal and per-block bottom-right causal masks; the NumPy oracle against torch.
Tolerances float64 1e-10, float32 1e-5 (tests/peers/common.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import attnkit
from attnkit import masks
from tests.peers.common import close, qkv, rand, ref
from tests.support.masks import MASK_SHAPES, block_diag, ids

# ---------------------------------------------------------------------------------------------
# property-based: random shapes / masks / layouts / backends against the float64 softmax
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 2), h=st.integers(1, 3), lq=st.sampled_from([1, 2, 7, 17]),
    lk=st.sampled_from([1, 3, 8, 33]), d=st.sampled_from([1, 4, 7]),
    kind=st.sampled_from(["causal", "br", "sw", "kpad", "bool", "float", "doc"]),
    backend=st.sampled_from(["auto", "math", "dense", "blocksparse"]),
    transposed=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_property_masks_backends(b, h, lq, lk, d, kind, backend, transposed, seed):
    g = torch.Generator().manual_seed(seed)

    def mk(n):
        if transposed:
            return torch.randn(b, n, h, d, generator=g, dtype=torch.float64).transpose(1, 2)
        return torch.randn(b, h, n, d, generator=g, dtype=torch.float64)

    q, k, v = mk(lq), mk(lk), mk(lk)
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    bias = None
    if kind == "causal":
        m, allowed = masks.causal(), j <= i
    elif kind == "br":
        m, allowed = masks.causal("bottom_right"), j <= i + lk - lq
    elif kind == "sw":
        m, allowed = masks.sliding_window(1, 2), (j >= i - 1) & (j <= i + 2)
    elif kind == "kpad":
        lens = torch.randint(0, lk + 1, (b,), generator=g)
        m, allowed = masks.key_padding(lens.tolist()), (j[None] < lens[:, None, None])[:, None]
    elif kind == "bool":
        m = allowed = torch.rand(b, 1, lq, lk, generator=g) > 0.5
    elif kind == "float":
        m = bias = torch.randn(lq, lk, generator=g, dtype=torch.float64)
        allowed = torch.ones(lq, lk, dtype=torch.bool)
    else:
        qi = torch.sort(torch.randint(0, 3, (lq,), generator=g))[0]
        ki = torch.sort(torch.randint(0, 3, (lk,), generator=g))[0]
        m, allowed = masks.document(qi, ki), qi[:, None] == ki[None, :]
    try:
        got = attnkit.scaled_dot_product_attention(q, k, v, m, backend=backend)
    except ValueError as e:  # a forced backend that cannot serve this call says so
        assert "cannot serve" in str(e)
        assume(False)
    close(got, ref(q, k, v, allowed, bias)[0], torch.float64)


# ---------------------------------------------------------------------------------------------
# PyTorch regression cases; more xformers attn_bias kinds
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [None, "causal"])
def test_fp16_overflow_regression(mask):
    # test_transformers.py test_scaled_dot_product_attention_fp16_overflow (pytorch#160841):
    # scores 256*256*80/sqrt(80) overflow float16; the result must be 256 everywhere, no NaN
    x = torch.full((1, 32, 23, 80), 256.0, dtype=torch.half)
    m = None if mask is None else masks.causal()
    y = attnkit.scaled_dot_product_attention(x, x, x, m)
    assert not y.isnan().any()
    assert torch.equal(y, x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", [-1e4, 1e4])
def test_large_scale_like_negative_scale_regression(dtype, scale):
    # test_scaled_dot_product_attention_math_with_negative_scale (pytorch#105190): scale=-1e4
    # (and +1e4) against the float64 softmax
    x = rand(1, 3, 64, 64, dtype=dtype)
    x64 = x.double()
    want = torch.softmax(x64 @ x64.transpose(-1, -2) * scale, -1) @ x64
    close(attnkit.scaled_dot_product_attention(x, x, x, scale=scale), want, dtype)


@pytest.mark.parametrize("window", [1, 2, 4])
def test_xformers_block_diagonal_causal_local(window):
    # BlockDiagonalCausalLocalAttentionMask: causal within each document, window `window`
    seqlens = [3, 5, 2]
    n = sum(seqlens)
    q, k, v = qkv(1, 2, n, n, 8)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = block_diag(seqlens, seqlens, "top_left") & (j > i - window)
    want, _ = ref(q, k, v, allowed)
    m = masks.document(ids(seqlens)) & masks.sliding_window(window - 1, 0)
    close(attnkit.scaled_dot_product_attention(q, k, v, m), want, torch.float64)


def test_xformers_block_diagonal_causal_from_bottom_right():
    # BlockDiagonalCausalFromBottomRightMask: each (q block, kv block) bottom-right causal;
    # attnkit expresses it with a predicate (FlexAttention mask_mod form)
    qs, ks = [2, 3, 1], [4, 3, 5]
    q, k, v = qkv(1, 2, sum(qs), sum(ks), 8)
    qid, kid = ids(qs), ids(ks)
    qpos = torch.cat([torch.arange(a) + (b - a) for a, b in zip(qs, ks)])  # bottom-right
    kpos = torch.cat([torch.arange(b) for b in ks])

    def fn(b, h, qi, kj):
        return (qid[qi] == kid[kj]) & (kpos[kj] <= qpos[qi])

    want, _ = ref(q, k, v, block_diag(qs, ks, "bottom_right"))
    got = attnkit.scaled_dot_product_attention(q, k, v, masks.from_predicate(fn))
    close(got, want, torch.float64)


@pytest.mark.parametrize("shape_fn", MASK_SHAPES)
def test_numpy_reference_matches_torch(shape_fn):
    # attnkit.reference (the float64 NumPy oracle) against torch's SDPA math, broadcast masks
    from attnkit.reference.dot_product_attention import scaled_dot_product

    b, h, lq, lk = 2, 3, 5, 7
    q, k, v = qkv(b, h, lq, lk, 4)
    m = torch.rand(shape_fn(b, h, lq, lk), generator=torch.Generator().manual_seed(4)) > 0.4
    m[..., 0] = True
    tr = scaled_dot_product(q.numpy(), k.numpy(), v.numpy(), m.numpy())
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    close(torch.tensor(tr.output), want, torch.float64)

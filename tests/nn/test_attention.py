"""MultiHeadAttention against torch.nn.MultiheadAttention, an independent float64 computation
(grouped-query heads), its own full forward (KV cache) and autograd (causality).

Tolerances: float32 max |ours - theirs| <= 1e-5 * max |theirs|; float64 <= 1e-10 relative.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnkit import masks
from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.cache import KVCache
from tests.support.numerics import max_rel_err

B, LQ, LK = 3, 7, 13


def torch_padding(lengths: list[int], n: int) -> torch.Tensor:
    """torch-style key_padding_mask (B, n): True = ignore."""
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]


def bf(x: torch.Tensor, batch_first: bool) -> torch.Tensor:
    return x if batch_first else x.transpose(0, 1).contiguous()


# ---------------------------------------------------------------------------------------------
# torch.nn.MultiheadAttention
# ---------------------------------------------------------------------------------------------
MASK_KINDS = ["none", "key_padding", "bool_attn", "float_attn", "key_padding+bool_attn"]


def make_masks(kind: str, gen: torch.Generator):
    """(torch kwargs, attnkit mask) for the same masking; no row is left fully masked."""
    kpm = torch_padding([LK, 9, 4], LK)
    disallowed = torch.rand(LQ, LK, generator=gen) < 0.4  # torch bool attn_mask: True = NOT allowed
    disallowed[:, 0] = False
    additive = torch.randn(LQ, LK, generator=gen)
    additive[disallowed] = -math.inf
    if kind == "none":
        return {}, None
    if kind == "key_padding":
        return {"key_padding_mask": kpm}, masks.from_key_padding_mask(kpm)
    if kind == "bool_attn":
        return {"attn_mask": disallowed}, masks.from_tensor(~disallowed)
    if kind == "float_attn":
        return {"attn_mask": additive}, masks.from_additive(additive)
    both = masks.from_key_padding_mask(kpm) & masks.from_tensor(~disallowed)
    return {"key_padding_mask": kpm, "attn_mask": disallowed}, both


# (packed in_proj, bias, batch_first): every pair of options appears in some configuration
CONFIGS = [(True, True, True), (True, False, False), (False, True, False), (False, False, True)]


@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize(("packed", "bias", "batch_first"), CONFIGS)
def test_from_torch_matches_torch(packed, bias, batch_first, mask_kind):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    e, h = 15, 3
    kdim, vdim = (None, None) if packed else (7, 11)
    m = nn.MultiheadAttention(
        e, h, dropout=0.25, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first
    ).eval()
    if bias:  # torch initialises the biases to 0; make them count
        with torch.no_grad():
            m.in_proj_bias.normal_()
            m.out_proj.bias.normal_()
    ours = MultiHeadAttention.from_torch(m)
    assert not ours.training
    q = torch.randn(B, LQ, e)
    k = torch.randn(B, LK, kdim or e)
    v = torch.randn(B, LK, vdim or e)
    q, k, v = (bf(t, batch_first) for t in (q, k, v))
    tkw, mask = make_masks(mask_kind, gen)

    ref_out, ref_w = m(q, k, v, **tkw)  # averaged weights (B, Lq, Lk)
    out, w = ours(q, k, v, mask, return_weights=True, average_weights=True)
    assert max_rel_err(out, ref_out) <= 1e-5
    assert max_rel_err(w, ref_w) <= 1e-5

    _, ref_wh = m(q, k, v, average_attn_weights=False, **tkw)  # per head (B, H, Lq, Lk)
    out_fast, none = ours(q, k, v, mask)  # fast path, no weights
    _, wh = ours(q, k, v, mask, return_weights=True)
    assert none is None
    assert max_rel_err(out_fast, ref_out) <= 1e-5
    assert max_rel_err(wh, ref_wh) <= 1e-5

    if mask_kind != "none":  # the mask must matter, or this test could not fail on masks
        assert (ours(q, k, v)[0] - ref_out).abs().max() > 1e-3


@pytest.mark.parametrize("packed", [True, False])
def test_to_torch_round_trip(packed):
    torch.manual_seed(2)
    kw = {} if packed else {"kdim": 5, "vdim": 9}
    ours = MultiHeadAttention(12, 4, batch_first=False, **kw)
    for p in ours.parameters():
        nn.init.normal_(p)
    m = ours.to_torch()
    assert m._qkv_same_embed_dim == packed and m.batch_first is False
    q = torch.randn(LQ, B, 12)
    k = torch.randn(LK, B, kw.get("kdim", 12))
    v = torch.randn(LK, B, kw.get("vdim", 12))
    assert max_rel_err(ours(q, k, v)[0], m(q, k, v, need_weights=False)[0]) <= 1e-5
    back = MultiHeadAttention.from_torch(m)
    for (n1, p1), (n2, p2) in zip(ours.named_parameters(), back.named_parameters(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)


def test_from_torch_rejects_unsupported():
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_zero_attn"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_zero_attn=True))
    with pytest.raises(TypeError, match="m:"):
        MultiHeadAttention.from_torch(nn.Linear(3, 3))
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(8, 4, num_kv_heads=2).to_torch()


# ---------------------------------------------------------------------------------------------
# grouped-query / multi-query attention against plain float64 math
# ---------------------------------------------------------------------------------------------
def gqa_reference(mha: MultiHeadAttention, x, mem, allowed):
    """Independent float64 multi-head attention with k/v heads repeated by hand."""
    h, g, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    b, lq, _ = x.shape
    lk = mem.shape[1]
    (wq, wk, wv), (bq, bk, bv) = mha.in_proj.weights(), mha.in_proj.biases()
    q = (x @ wq.T + bq).reshape(b, lq, h, d)
    k = (mem @ wk.T + bk).reshape(b, lk, g, d)
    v = (mem @ wv.T + bv).reshape(b, lk, g, d)
    heads, weights = [], []
    for i in range(h):
        j = i * g // h  # query head i reads key/value head j
        s = torch.einsum("bqd,bkd->bqk", q[:, :, i], k[:, :, j]) / math.sqrt(d)
        s = s.masked_fill(~allowed, -math.inf)
        w = torch.softmax(s, dim=-1)
        heads.append(w @ v[:, :, j])
        weights.append(w)
    cat = torch.cat(heads, dim=-1)
    return cat @ mha.out_proj.weight.T + mha.out_proj.bias, torch.stack(weights, 1)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 3, 6])
def test_grouped_query_against_float64_math(num_kv_heads):
    torch.manual_seed(3)
    mha = MultiHeadAttention(30, 6, num_kv_heads=num_kv_heads, dtype=torch.float64).eval()
    for p in mha.parameters():
        nn.init.normal_(p, std=0.3)
    assert mha.in_proj.weight.shape == (30 + 2 * num_kv_heads * 5, 30)  # q | k | v packed
    x = torch.randn(B, LQ, 30, dtype=torch.float64)
    mem = torch.randn(B, LK, 30, dtype=torch.float64)
    lengths = [13, 1, 6]
    allowed = (torch.arange(LK)[None, None, :] < torch.tensor(lengths)[:, None, None]).expand(
        B, LQ, LK
    )
    ref_out, ref_w = gqa_reference(mha, x, mem, allowed)
    out, w = mha(x, mem, mask=masks.key_padding(lengths), return_weights=True)
    assert max_rel_err(out, ref_out) <= 1e-10
    assert max_rel_err(w, ref_w) <= 1e-10
    fast, _ = mha(x, mem, mask=masks.key_padding(lengths))
    assert max_rel_err(fast, ref_out) <= 1e-10


def test_self_attention_defaults_key_and_value_to_query():
    torch.manual_seed(4)
    mha = MultiHeadAttention(12, 3).eval()
    x = torch.randn(B, LQ, 12)
    assert torch.equal(mha(x)[0], mha(x, x, x)[0])
    mem = torch.randn(B, LK, 12)
    assert torch.equal(mha(x, mem)[0], mha(x, mem, mem)[0])


def test_fully_masked_row_gives_bias_not_nan():
    torch.manual_seed(5)
    mha = MultiHeadAttention(12, 3).eval()
    nn.init.normal_(mha.out_proj.bias)
    x = torch.randn(2, LQ, 12)
    out, w = mha(x, mask=masks.key_padding([0, LQ]), return_weights=True)
    # batch 0 sees no key: every head outputs 0, so the result is out_proj's bias
    assert max_rel_err(out[0], mha.out_proj.bias.expand(LQ, 12)) <= 1e-6
    assert torch.count_nonzero(w[0]) == 0
    assert not torch.isnan(out).any()


# ---------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------
def rope(x: torch.Tensor, offset: int) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of x (B, n, L, d) at positions offset.."""
    d, length = x.shape[-1], x.shape[-2]
    half = d // 2
    inv = 10000.0 ** (-torch.arange(half, dtype=x.dtype) / half)
    ang = torch.arange(offset, offset + length, dtype=x.dtype)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class ToyRotary(nn.Module):
    """Stand-in with the rotary call signature; records the offsets it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int]] = []

    def forward(self, q, k, q_offset, k_offset):
        self.calls.append((q_offset, k_offset))
        return rope(q, q_offset), rope(k, k_offset)


@pytest.mark.parametrize(
    ("num_kv_heads", "rotary", "chunks"),
    [(None, False, [1] * 13), (2, False, [4, 1, 3, 5]), (1, True, [1] * 13), (4, True, [5, 8])],
)
def test_self_attention_cache_matches_full_causal_forward(num_kv_heads, rotary, chunks):
    torch.manual_seed(6)
    rot = ToyRotary() if rotary else None
    mha = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, rotary=rot).eval()
    x = torch.randn(B, LK, 16)
    pad = masks.key_padding([13, 8, 11])
    full, _ = mha(x, mask=masks.causal() & pad)
    cache = mha.new_cache()
    outs, pos = [], 0
    for n in chunks:
        o, w = mha(
            x[:, pos : pos + n],
            mask=masks.causal("bottom_right") & pad,
            cache=cache,
            return_weights=True,
        )
        assert w.shape == (B, 4, n, pos + n)
        outs.append(o)
        pos += n
    assert cache.length == cache.seen == LK
    assert cache.k.shape == (B, num_kv_heads or 4, LK, 4)  # k/v heads are cached unrepeated
    assert max_rel_err(torch.cat(outs, dim=1), full) <= 1e-5
    if rotary:
        starts = [0] + list(torch.tensor(chunks).cumsum(0)[:-1].tolist())
        assert rot.calls[1:] == [(s, s) for s in starts]
        mha.rotary = None
        assert (mha(x, mask=masks.causal() & pad)[0] - full).abs().max() > 1e-3


def test_static_cache_reuses_cross_attention_keys():
    torch.manual_seed(7)
    mha = MultiHeadAttention(12, 3, kdim=5, vdim=5).eval()
    x = torch.randn(B, LQ, 12)
    mem = torch.randn(B, LK, 5)
    full, _ = mha(x, mem, mask=masks.key_padding([13, 2, 7]))
    cache = KVCache(static=True)
    steps = [
        mha(x[:, t : t + 1], mem, mask=masks.key_padding([13, 2, 7]), cache=cache)[0]
        for t in range(LQ)
    ]
    assert max_rel_err(torch.cat(steps, 1), full) <= 1e-5
    k_first = cache.k
    mha(x[:, :1], mem * 100, cache=cache)  # memory is not re-projected once cached
    assert cache.k is k_first and cache.seen == LQ + 1
    again, _ = mha(x[:, 3:4], cache=cache)  # key/value may be omitted once cached
    assert max_rel_err(again, mha(x[:, 3:4], mem)[0]) <= 1e-5
    with pytest.raises(ValueError, match="key: the static cache holds Lk = 13"):
        mha(x[:, :1], mem[:, :5], cache=cache)


def test_cache_reorder_selects_batch_rows():
    torch.manual_seed(8)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(B, 5, 8)
    cache = mha.new_cache()
    mha(x[:, :4], mask=masks.causal(), cache=cache)
    idx = torch.tensor([2, 2, 0])
    cache.reorder(idx)
    last, _ = mha(x[idx, 4:], cache=cache)
    full, _ = mha(x[idx], mask=masks.causal())
    assert max_rel_err(last, full[:, 4:]) <= 1e-5


def test_cache_errors():
    a, b = MultiHeadAttention(8, 2), MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    cache = a.new_cache()
    with pytest.raises(ValueError, match="cache: this KVCache belongs to another"):
        b(x, cache=cache)
    free = KVCache()
    a(x, cache=free)  # an unclaimed cache is claimed by its first user
    assert free.owner_id == id(a)
    with pytest.raises(ValueError, match="cache"):
        b(x, cache=free)
    with pytest.raises(ValueError, match="cache: holds batch size 2"):
        a(torch.randn(3, 1, 8), cache=free)
    with pytest.raises(ValueError, match="mask: Causal.* is top-left aligned"):
        a(x[:, :1], mask=masks.causal() & masks.key_padding([3, 3]), cache=free)
    n = free.length
    with pytest.raises(ValueError, match="mask: expected a shape broadcastable"):
        a(x[:, :1], mask=torch.ones(1, n + 5, dtype=torch.bool), cache=free)
    assert free.length == free.seen == n  # a call that raised leaves the cache unchanged
    with pytest.raises(TypeError, match="cache"):
        a(x, cache={"k": None})
    with pytest.raises(ValueError, match="rotary"):
        MultiHeadAttention(8, 2, rotary=ToyRotary())(x, cache=KVCache(static=True))


# ---------------------------------------------------------------------------------------------
# causality
# ---------------------------------------------------------------------------------------------
def test_causal_mask_blocks_gradients_from_later_positions():
    torch.manual_seed(9)
    mha = MultiHeadAttention(12, 3, num_kv_heads=1)
    x = torch.randn(2, 11, 12, requires_grad=True)
    out, _ = mha(x, mask=masks.causal())
    r = torch.randn(12)
    for i in range(11):
        (g,) = torch.autograd.grad((out[:, i] @ r).sum(), x, retain_graph=True)
        assert torch.count_nonzero(g[:, i + 1 :]) == 0, f"output {i} depends on later inputs"
        assert (g[:, : i + 1].abs().sum(-1) > 0).all(), f"output {i} ignores earlier inputs"

"""PyTorch ``test/test_transformers.py`` cases: scaled_dot_product_attention.

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
from attnkit.functional import grouped_query_attention
from tests.peers.common import close, qkv, rand, ref
from tests.support.masks import MASK_SHAPES


# ---------------------------------------------------------------------------------------------
# PyTorch test_transformers.py: SDPA
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (2, 3, 7, 5, 8), (1, 2, 97, 33, 16)])
def test_sdpa_matches_torch_math(dtype, shape):
    # test_transformers.py: test_scaled_dot_product_attention_math vs SDPA (scale=None default)
    b, h, lq, lk, d = shape
    q, k, v = qkv(b, h, lq, lk, d, dtype=dtype)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    close(attnkit.scaled_dot_product_attention(q, k, v), want, dtype)


@pytest.mark.parametrize("scale", [0.3, 1.0, 2.5, 1e-3])
def test_sdpa_custom_scale(scale):
    # test_transformers.py: test_scaled_dot_product_attention with scale=...
    q, k, v = qkv(2, 2, 5, 6, 4)
    want = F.scaled_dot_product_attention(q, k, v, scale=scale)
    close(attnkit.scaled_dot_product_attention(q, k, v, scale=scale), want, torch.float64)


@pytest.mark.parametrize("backend", ["auto", "dense", "math", "blocksparse"])
@pytest.mark.parametrize("scale", [-0.5, -1.0, 0.0])
def test_sdpa_negative_and_zero_scale(scale, backend):
    # test_scaled_dot_product_attention_math_with_negative_scale: torch accepts any finite
    # scale, and so does attnkit; forward and gradients against torch's math in float64
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 9, 11, 4))
    mask = masks.sliding_window(2) if backend == "blocksparse" else None
    allowed = None if mask is None else mask.materialize(9, 11)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    got = attnkit.scaled_dot_product_attention(q, k, v, mask, scale=scale, backend=backend)
    close(got, want, torch.float64)
    g = torch.randn_like(want)
    for a, b in zip(
        torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)
    ):
        close(a, b, torch.float64)


@pytest.mark.parametrize("lq,lk", [(3, 7), (7, 3), (1, 5), (5, 1), (6, 6)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_upper_left_lq_ne_lk(lq, lk, dtype):
    # test_transformers.py: is_causal with Lq != Lk is upper-left aligned (causal_upper_left)
    q, k, v = qkv(2, 2, lq, lk, 8, dtype=dtype)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    got = attnkit.scaled_dot_product_attention(q, k, v, masks.causal())
    close(got, want, dtype)


@pytest.mark.parametrize("lq,lk", [(3, 7), (1, 9), (5, 5), (7, 3)])
def test_causal_lower_right_lq_ne_lk(lq, lk):
    # test_transformers.py: causal_lower_right (CausalBias) == tril(diagonal=Lk-Lq);
    # for Lq > Lk the first rows have no key: attnkit gives 0 (documented), torch NaN.
    q, k, v = qkv(1, 2, lq, lk, 8)
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
    want, _ = ref(q, k, v, allowed)
    got = attnkit.scaled_dot_product_attention(q, k, v, masks.causal("bottom_right"))
    close(got, want, torch.float64)
    if lq <= lk:
        close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), torch.float64)


@pytest.mark.parametrize("shape_fn", MASK_SHAPES)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attn_mask_broadcast_shapes(shape_fn, kind):
    # test_transformers.py: attn_mask broadcast to (B, H, Lq, Lk), bool and additive float
    b, h, lq, lk = 2, 3, 5, 7
    q, k, v = qkv(b, h, lq, lk, 4)
    shape = shape_fn(b, h, lq, lk)
    g = torch.Generator().manual_seed(1)
    if kind == "bool":
        m = torch.rand(shape, generator=g) > 0.3
        m[..., 0] = True  # no fully masked row: torch's NaN does not enter
    else:
        m = torch.randn(shape, generator=g, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    close(attnkit.scaled_dot_product_attention(q, k, v, m), want, torch.float64)


def test_float_mask_with_neg_inf_matches_bool():
    # test_transformers.py: bool mask == float mask with -inf at False
    q, k, v = qkv(2, 2, 6, 6, 4)
    allowed = torch.rand(6, 6, generator=torch.Generator().manual_seed(3)) > 0.4
    allowed[:, 2] = True
    fmask = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~allowed, -math.inf)
    a = attnkit.scaled_dot_product_attention(q, k, v, allowed)
    b = attnkit.scaled_dot_product_attention(q, k, v, fmask)
    close(a, b, torch.float64)
    close(a, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), torch.float64)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fully_masked_rows_give_zero(kind, dtype):
    # test_transformers.py test_fully_masked_out_rows: torch gives NaN (math) or 0 (fused);
    # attnkit documents output 0, weights 0 and gradient 0.
    q, k, v = qkv(2, 2, 4, 5, 8, dtype=dtype)
    q.requires_grad_(True)
    allowed = torch.ones(4, 5, dtype=torch.bool)
    allowed[1] = False
    allowed[3, :2] = False
    m = (
        allowed
        if kind == "bool"
        else torch.zeros(4, 5, dtype=dtype).masked_fill(~allowed, -math.inf)
    )
    out, w = attnkit.scaled_dot_product_attention(q, k, v, m, return_weights=True)
    want, want_w = ref(q.detach(), k, v, allowed)
    close(out, want, dtype)
    close(w, want_w, dtype)
    assert torch.all(out[:, :, 1] == 0)
    out.sum().backward()
    assert torch.all(q.grad[:, :, 1] == 0)


@pytest.mark.parametrize("h,g", [(4, 2), (6, 1), (8, 4)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_enable_gqa(h, g, dtype):
    # test_transformers.py: enable_gqa=True (query head i uses kv head i // (H / G))
    q = rand(2, h, 5, 8, dtype=dtype)
    k = rand(2, g, 7, 8, dtype=dtype, seed=5)
    v = rand(2, g, 7, 8, dtype=dtype, seed=6)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    close(grouped_query_attention(q, k, v), want, dtype)
    want_c = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True
    )
    close(grouped_query_attention(q, k, v, masks.causal()), want_c, dtype)


def test_dropout_zero_is_exact():
    # test_transformers.py: dropout_p=0.0 gives the deterministic result, bit for bit
    q, k, v = qkv(2, 2, 7, 9, 8)
    a = attnkit.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    b = attnkit.scaled_dot_product_attention(q, k, v)
    assert torch.equal(a, b)


def test_dropout_statistics():
    # test_transformers.py test_dropout: dropout keeps expected value (scaled by 1/(1-p))
    torch.manual_seed(0)
    q = torch.zeros(1, 1, 1, 4, dtype=torch.float64)
    k = torch.zeros(1, 1, 4000, 4, dtype=torch.float64)
    v = torch.ones(1, 1, 4000, 1, dtype=torch.float64)
    out = attnkit.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    # mean of 4000 weights 1/4000 kept w.p. 0.5 and doubled: 1 +- ~0.05 (3 sigma)
    assert abs(out.item() - 1.0) < 0.05


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_three_dim_inputs(dtype):
    # test_transformers.py: SDPA on 3-D inputs (B, L, E): no head dim
    q, k, v = (rand(3, 6, 5, dtype=dtype, seed=s) for s in (0, 1, 2))
    k = rand(3, 9, 5, dtype=dtype, seed=1)
    v = rand(3, 9, 7, dtype=dtype, seed=2)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    close(attnkit.scaled_dot_product_attention(q, k, v), want, dtype)
    want_c = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    close(attnkit.scaled_dot_product_attention(q, k, v, masks.causal()), want_c, dtype)


def test_two_dim_inputs():
    q, k, v = rand(4, 3), rand(6, 3, seed=1), rand(6, 2, seed=2)
    close(attnkit.scaled_dot_product_attention(q, k, v), ref(q, k, v)[0], torch.float64)


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 2, 0, 4), (2, 2, 5, 4), (2, 2, 5, 4)),  # Lq = 0
        ((0, 2, 3, 4), (0, 2, 5, 4), (0, 2, 5, 4)),  # B = 0
        ((2, 2, 3, 4), (2, 2, 0, 4), (2, 2, 0, 4)),  # Lk = 0
    ],
)
def test_empty_tensors_refused(shapes):
    # test_transformers.py: SDPA on empty tensors returns an empty result in torch; attnkit
    # documents "non-empty" inputs and raises ValueError naming the argument.
    q, k, v = (torch.zeros(s, dtype=torch.float64) for s in shapes)
    with pytest.raises(ValueError, match=r"^(q|k|v):"):
        attnkit.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize(
    "case,exc,name",
    [
        ("d_mismatch", ValueError, "k"),
        ("lk_mismatch", ValueError, "v"),
        ("dtype_mismatch", TypeError, "k"),
        ("int_q", TypeError, "q"),
        ("batch_broadcast", ValueError, "k"),
        ("dim_mismatch", ValueError, "k"),
        ("mask_shape", ValueError, "mask"),
        ("mask_int", TypeError, "mask"),
        ("dropout_neg", ValueError, "dropout_p"),
        ("dropout_one", ValueError, "dropout_p"),
        ("scale_nan", ValueError, "scale"),
        ("one_dim", ValueError, "q"),
        ("not_tensor", TypeError, "q"),
    ],
)
def test_invalid_inputs(case, exc, name):
    # test_transformers.py test_invalid_inputs_*: torch rejects (RuntimeError); attnkit raises
    # ValueError/TypeError naming the argument. Batch broadcast: torch broadcasts, attnkit
    # documents that it never broadcasts batch dims.
    q, k, v = qkv(2, 2, 3, 4, 5)
    kw = {}
    mask = None
    if case == "d_mismatch":
        k = rand(2, 2, 4, 6)
    elif case == "lk_mismatch":
        v = rand(2, 2, 5, 5)
    elif case == "dtype_mismatch":
        k = k.float()
    elif case == "int_q":
        q = q.long()
    elif case == "batch_broadcast":
        k, v = k[:1], v[:1]
    elif case == "dim_mismatch":
        k, v = k[0], v[0]
    elif case == "mask_shape":
        mask = torch.ones(3, 5, dtype=torch.bool)
    elif case == "mask_int":
        mask = torch.ones(3, 4, dtype=torch.int64)
    elif case == "dropout_neg":
        kw["dropout_p"] = -0.1
    elif case == "dropout_one":
        kw["dropout_p"] = 1.0
    elif case == "scale_nan":
        kw["scale"] = float("nan")
    elif case == "one_dim":
        q, k, v = rand(5), rand(5), rand(5)
    elif case == "not_tensor":
        q = q.tolist()
    with pytest.raises(exc, match=rf"^{name}\b"):
        attnkit.scaled_dot_product_attention(q, k, v, mask, **kw)


def test_weights_match_softmax():
    q, k, v = qkv(2, 3, 5, 6, 4)
    m = torch.randn(5, 6, dtype=torch.float64)
    out, w = attnkit.scaled_dot_product_attention(q, k, v, m, return_weights=True)
    want_w = torch.softmax(q @ k.transpose(-2, -1) / 2 + m, -1)
    close(w, want_w, torch.float64)
    close(out, want_w @ v, torch.float64)


def test_gradients_match_torch_with_float_mask():
    # test_transformers.py: gradcheck of SDPA incl. attn_mask (the mask requires grad)
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 4, 5, 3))
    m = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    attnkit.scaled_dot_product_attention(q, k, v, m).pow(2).sum().backward()
    got = [t.grad.clone() for t in (q, k, v, m)]
    for t in (q, k, v, m):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, attn_mask=m).pow(2).sum().backward()
    for a, t in zip(got, (q, k, v, m)):
        close(a, t.grad, torch.float64)


def test_non_contiguous_inputs():
    # test_transformers.py: non-contiguous / transposed inputs
    q = rand(2, 5, 3, 4).transpose(1, 2)  # (2, 3, 5, 4) strided view
    k = rand(2, 6, 3, 4, seed=1).transpose(1, 2)  # (2, 3, 6, 4)
    v = rand(2, 6, 3, 4, seed=2).transpose(1, 2)
    want = F.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous())
    close(attnkit.scaled_dot_product_attention(q, k, v), want, torch.float64)


def test_large_scores_float32():
    # test_transformers.py: large inputs; attnkit P3: finite extreme scores stay exact
    q, k, v = qkv(1, 1, 4, 6, 8, dtype=torch.float32)
    q = q * 1e3
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    close(attnkit.scaled_dot_product_attention(q, k, v), want, torch.float32)


# ---------------------------------------------------------------------------------------------
# more PyTorch test_transformers.py cases: attn_mask with is_causal, low precision, backends
# ---------------------------------------------------------------------------------------------
def test_causal_and_tensor_mask_combined():
    # torch: attn_mask & is_causal are combined by callers as one mask (tril & attn_mask)
    q, k, v = qkv(2, 2, 6, 6, 4)
    g = torch.Generator().manual_seed(7)
    allowed = torch.rand(2, 1, 6, 6, generator=g) > 0.3
    allowed[..., 0] = True
    bias = torch.randn(6, 6, generator=g, dtype=torch.float64)
    tril = torch.ones(6, 6, dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed & tril)
    got = attnkit.scaled_dot_product_attention(q, k, v, masks.causal() & masks.from_tensor(allowed))
    close(got, want, torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~tril, -math.inf))
    got = attnkit.scaled_dot_product_attention(q, k, v, masks.causal() & masks.from_tensor(bias))
    close(got, want, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mask", [None, "causal", "bool"])
def test_low_precision_within_torch_error(dtype, mask):
    # test_transformers.py: fp16/bf16 compared to a float64 reference with a tolerance derived
    # from the plain implementation's own error at that dtype (here: 2x torch's + 1 ulp)
    q, k, v = qkv(2, 4, 33, 17, 16)
    m = None
    if mask == "causal":
        m = torch.ones(33, 17, dtype=torch.bool).tril()
    elif mask == "bool":
        m = torch.rand(33, 17, generator=torch.Generator().manual_seed(2)) > 0.4
        m[:, 0] = True
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    lo = [t.to(dtype) for t in (q, k, v)]
    torch_err = (F.scaled_dot_product_attention(*lo, attn_mask=m).double() - want).abs().max()
    got = attnkit.scaled_dot_product_attention(*lo, m)
    assert got.dtype == dtype
    err = (got.double() - want).abs().max()
    assert err <= 2 * torch_err + torch.finfo(dtype).eps


@pytest.mark.parametrize("backend", ["math", "dense", "blocksparse"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_backend_fully_masked_and_causal(backend, dtype):
    # every backend: causal upper-left plus a fully masked row (attnkit: 0, documented)
    q, k, v = qkv(2, 3, 19, 23, 8, dtype=dtype)
    allowed = torch.ones(19, 23, dtype=torch.bool).tril()
    allowed[4] = False
    m = masks.causal() & masks.from_tensor(allowed)
    want, _ = ref(q, k, v, allowed)
    close(attnkit.scaled_dot_product_attention(q, k, v, m, backend=backend), want, dtype)


def test_double_backward_math_backend():
    # test_transformers.py gradgradcheck of the math SDPA (torch's math path supports it)
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 4, 5, 3))
    fn = lambda q, k, v: attnkit.scaled_dot_product_attention(  # noqa: E731
        q, k, v, masks.causal(), backend="math"
    )
    assert torch.autograd.gradgradcheck(fn, (q, k, v))


@pytest.mark.xfail(
    strict=True,
    reason="backend='auto' picks dense/blocksparse (torch fused CPU SDPA) even when gradients "
    "are needed; a double backward then raises torch's RuntimeError 'derivative for "
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented' "
    "(torch's own F.sdpa does the same; math backend works)",
)
def test_double_backward_auto_backend():
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 4, 5, 3))
    fn = lambda q, k, v: attnkit.scaled_dot_product_attention(q, k, v)  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, (q, k, v))


def test_finite_huge_negative_bias_matches_torch():
    # policy P2 / torch: -1e30 is a real bias, not "masked"; a uniform row shift changes nothing
    q, k, v = qkv(1, 2, 5, 7, 4)
    bias = torch.zeros(5, 7, dtype=torch.float64)
    bias[:, 3] = -1e30
    bias[2] = -1e30  # whole row shifted: still a valid (uniform) row in float64
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    close(attnkit.scaled_dot_product_attention(q, k, v, bias), want, torch.float64)

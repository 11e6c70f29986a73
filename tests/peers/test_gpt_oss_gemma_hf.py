"""transformers' eager attention of gpt-oss (attention sinks) and Gemma 2 (logit softcapping),
and gpt-oss's own reference ``sdpa`` (gpt_oss/torch/model.py), ported as semantics: GQA heads,
sliding window, the sink logit joining each row's softmax and then dropped, and the softcap
``tanh(s / c) * c`` after the scale and before the mask.

The reference is the peers' formula written here in float64 torch; tolerance 1e-5 (float32)
with the same absolute floor, 1e-10 in float64. Non-finite sinks are refused as by
:mod:`attnkit.reference` (a NaN sink would make every output row of its head NaN)."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import masks
from attnkit.functional import (
    grouped_query_attention,
    multi_head_attention,
    scaled_dot_product_attention,
)

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def eager_ref(q, k, v, sinks=None, softcap=None, window=None):
    """transformers' gpt-oss / gemma2 eager_attention_forward in float64: q (B, H, L, d),
    k/v (B, G, L, d) repeated to H (repeat_kv), causal mask (and sliding window: key j
    allowed iff i - window < j <= i), sinks (H,) concatenated as a last logit column,
    max-subtracted softmax, the sink column dropped."""
    h, g = q.shape[1], k.shape[1]
    q, k, v = q.double(), k.double(), v.double()
    k, v = k.repeat_interleave(h // g, 1), v.repeat_interleave(h // g, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    lq, lk = s.shape[-2:]
    i, j = torch.arange(lq).view(-1, 1), torch.arange(lk).view(1, -1)
    ok = j <= i
    if window is not None:
        ok = ok & (j > i - window)
    s = s.masked_fill(~ok, -math.inf)
    if sinks is not None:
        col = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        s = torch.cat([s, col], -1)
        s = s - s.max(-1, keepdim=True).values
        return torch.softmax(s, -1)[..., :-1] @ v
    return torch.softmax(s, -1) @ v


def attnkit_mask(window):
    return masks.causal() if window is None else masks.sliding_window(window - 1, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("g", [1, 2, 8])
@pytest.mark.parametrize("backend", ["auto", "math", "blocksparse"])
def test_gpt_oss_sinks_gqa_window(dtype, window, g, backend):
    # gpt-oss: 64 query heads over 8 kv heads, sliding window 128 on every other layer, one
    # learned sink per head; here 8 heads, window 4, L 37
    gen = torch.Generator().manual_seed(g * 10 + (window or 0))
    q = torch.randn(2, 8, 37, 16, generator=gen, dtype=dtype) * 2
    k = torch.randn(2, g, 37, 16, generator=gen, dtype=dtype) * 2
    v = torch.randn(2, g, 37, 16, generator=gen, dtype=dtype)
    sinks = torch.randn(8, generator=gen, dtype=dtype) * 3
    want = eager_ref(q, k, v, sinks=sinks, window=window)
    got = grouped_query_attention(q, k, v, attnkit_mask(window), sinks=sinks, backend=backend)
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype])


def test_gpt_oss_sink_gradient():
    # the sink is a learned parameter: d(out)/d(sinks) against the float64 formula's autograd
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 9, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    sinks = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(1, 4, 9, 8, generator=gen, dtype=torch.float64)
    for backend in ("auto", "math", "blocksparse"):
        got = scaled_dot_product_attention(q, k, v, masks.causal(), sinks=sinks, backend=backend)
        (g_got,) = torch.autograd.grad(got, sinks, dout)
        (g_want,) = torch.autograd.grad(eager_ref(q, k, v, sinks=sinks), sinks, dout)
        torch.testing.assert_close(g_got, g_want, rtol=1e-9, atol=1e-10, msg=backend)


@pytest.mark.parametrize("softcap", [50.0, 2.0])
@pytest.mark.parametrize("window", [None, 6])
def test_gemma2_softcap_eager(softcap, window):
    # Gemma 2: attn_logit_softcapping 50 (softcap after scaling, before the causal mask),
    # sliding window 4096 on every other layer, GQA 8/4; here scores made large enough to cap
    gen = torch.Generator().manual_seed(int(softcap))
    q = torch.randn(2, 8, 21, 16, generator=gen) * 8
    k, v = torch.randn(2, 4, 21, 16, generator=gen) * 8, torch.randn(2, 4, 21, 16, generator=gen)
    want = eager_ref(q, k, v, softcap=softcap, window=window)
    for backend in ("auto", "math", "blocksparse"):
        got = grouped_query_attention(
            q, k, v, attnkit_mask(window), softcap=softcap, backend=backend
        )
        torch.testing.assert_close(got.double(), want, rtol=TOL[q.dtype], atol=1e-5, msg=backend)


def test_sinks_and_softcap_through_multi_head_attention():
    # the projected form (gpt-oss's AttentionBlock: qkv Linear, sdpa with sinks, out Linear)
    gen = torch.Generator().manual_seed(2)
    e, h, g, d = 32, 4, 2, 8
    x = torch.randn(2, 11, e, generator=gen, dtype=torch.float64)
    w_q, w_k = torch.randn(h * d, e, generator=gen), torch.randn(g * d, e, generator=gen)
    w_v, w_o = torch.randn(g * d, e, generator=gen), torch.randn(e, h * d, generator=gen)
    w_q, w_k, w_v, w_o = (t.double() / math.sqrt(e) for t in (w_q, w_k, w_v, w_o))
    sinks = torch.randn(h, generator=gen, dtype=torch.float64)
    got, _ = multi_head_attention(
        x, x, x, h, w_q, w_k, w_v, w_o, mask=masks.causal(), num_kv_heads=g, sinks=sinks,
        softcap=3.0,
    )  # fmt: skip

    def split(t, n):
        return t.view(2, 11, n, d).transpose(1, 2)

    heads = eager_ref(split(x @ w_q.T, h), split(x @ w_k.T, g), split(x @ w_v.T, g), sinks, 3.0)
    want = heads.transpose(1, 2).reshape(2, 11, h * d) @ w_o.T
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("fn", ["sdpa", "gqa", "mha"])
def test_non_finite_sinks_are_refused(bad, fn):
    # attnkit.reference.scaled_dot_product_sinks refuses them; the functions did not (a NaN
    # sink gave a NaN head), also on a call whose signature was seen before (memo)
    q = k = v = torch.randn(1, 2, 3, 4)
    ok, sinks = torch.zeros(2), torch.tensor([0.0, bad])
    x, w = torch.randn(1, 3, 8), torch.randn(8, 8)
    calls = {
        "sdpa": lambda s: scaled_dot_product_attention(q, k, v, sinks=s),
        "gqa": lambda s: grouped_query_attention(q, k[:, :1], v[:, :1], sinks=s),
        "mha": lambda s: multi_head_attention(x, x, x, 2, w, w, w, w, sinks=s),
    }
    calls[fn](ok)  # remembered signature
    with pytest.raises(ValueError, match="sinks: expected finite logits"):
        calls[fn](sinks)

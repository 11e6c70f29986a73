"""flash-attention ``tests/test_flash_attn.py`` semantics: causal (bottom-right when
seqlen_q != seqlen_k), local windows ``window_size=(left, right)``, ``softcap``, MQA/GQA, and
``flash_attn_with_kvcache`` (per-row ``cache_seqlens``, new keys written into a longer cache
buffer), forward and gradients, on every backend that serves the call.

The reference is flash-attention's own ``attention_ref`` / ``construct_local_mask`` rewritten
here in float64 torch (independent of attnkit): scores = q k^T / sqrt(d), capped to
``softcap * tanh(s / softcap)``, positions outside the local window masked, a row without any
allowed key gives 0 (flash-attn's ``masked_fill(all masked, 0)``). Tolerance: float32 1e-5
absolute and relative (flash-attn asserts at most twice PyTorch's own float32 error, which is
below that here)."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import masks
from attnkit.functional import grouped_query_attention
from tests.peers.common import rand

BACKENDS = ("auto", "math", "blocksparse", "dense", "decode")
TOL = 1e-5


def local_allowed(lq, lk, window=(-1, -1), key_lens=None, batch=1):
    """flash-attn's construct_local_mask (negated: True = may attend), bottom-right aligned
    to each row's key length ``key_lens`` (B,) (cache_seqlens + new keys), (B, 1, Lq, Lk)."""
    row = torch.arange(lq).view(1, 1, lq, 1)
    col = torch.arange(lk).view(1, 1, 1, lk)
    sk = torch.full((batch,), lk) if key_lens is None else key_lens
    sk = sk.view(-1, 1, 1, 1)
    ok = col < sk
    left, right = window
    if right >= 0:
        ok = ok & (col <= row + sk - lq + right)
    if left >= 0:
        ok = ok & (col >= row + sk - lq - left)
    return ok


def attention_ref(q, k, v, allowed=None, softcap=0.0):
    """float64 flash-attn attention_ref on q (B, H, Lq, d), k/v (B, G, Lk, d)."""
    h, g = q.shape[1], k.shape[1]
    q, k, v = q.double(), k.double(), v.double()
    k, v = k.repeat_interleave(h // g, 1), v.repeat_interleave(h // g, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    w = torch.softmax(s, -1)
    if allowed is not None:
        w = w.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    return w @ v


def window_mask(window, causal):
    """attnkit's mask for flash-attn's (window_size, causal): bottom-right aligned."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    lo = -math.inf if left < 0 else -left
    hi = math.inf if right < 0 else right
    return masks.Band(lo, hi, "bottom_right")


def run_backends(fn):
    """fn(backend) on every backend that accepts the call; the result of each."""
    out = {}
    for b in BACKENDS:
        try:
            out[b] = fn(b)
        except ValueError as e:
            assert b not in ("auto", "math"), e  # math serves every dot-product call
            assert "cannot serve this call" in str(e)
    return out


@pytest.mark.parametrize("lq,lk", [(1, 1), (1, 147), (3, 97), (113, 203), (97, 33), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (5, 3), (0, 0), (17, -1)])
@pytest.mark.parametrize("g", [6, 2, 1])  # mha, gqa, mqa
def test_flash_attn_output(lq, lk, causal, window, g):
    # test_flash_attn_output / test_flash_attn_varlen_output: (seqlen_q, seqlen_k), causal,
    # local, mha_type; forward against attention_ref on every backend that serves the call
    q, k = rand(2, 6, lq, 16, dtype=torch.float32), rand(2, g, lk, 16, dtype=torch.float32)
    v = rand(2, g, lk, 16, seed=1, dtype=torch.float32)
    m = window_mask(window, causal)
    w = (window[0], 0) if causal else window
    want = attention_ref(q, k, v, None if m is None else local_allowed(lq, lk, w))
    got = run_backends(lambda b: grouped_query_attention(q, k, v, m, backend=b))
    for b, out in got.items():
        torch.testing.assert_close(out.double(), want, rtol=TOL, atol=TOL, msg=b)


@pytest.mark.parametrize("softcap", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("lq,lk,window,causal", [(7, 29, (-1, -1), True), (33, 33, (4, 4), False)])
def test_flash_attn_softcap_forward_and_grads(softcap, lq, lk, window, causal):
    # test_flash_attn_output with softcap > 0 (Gemma 2): scale, then cap, then mask; dq, dk,
    # dv against attention_ref's autograd in float64
    g = torch.Generator().manual_seed(int(softcap * 10) + lq)
    q = (torch.randn(2, 4, lq, 16, generator=g) * 4).requires_grad_()
    k = (torch.randn(2, 2, lk, 16, generator=g) * 4).requires_grad_()
    v = torch.randn(2, 2, lk, 16, generator=g).requires_grad_()
    m = window_mask(window, causal)
    allowed = local_allowed(lq, lk, (window[0], 0) if causal else window)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = attention_ref(q64, k64, v64, allowed, softcap)
    dout = torch.randn(want.shape, generator=g, dtype=torch.float64)
    want_grads = torch.autograd.grad(want, (q64, k64, v64), dout)
    for b in ("auto", "math", "blocksparse"):
        out = grouped_query_attention(q, k, v, m, softcap=softcap, backend=b)
        torch.testing.assert_close(out.double(), want, rtol=TOL, atol=TOL, msg=b)
        grads = torch.autograd.grad(out, (q, k, v), dout.float())
        for name, a, w in zip("qkv", grads, want_grads):
            torch.testing.assert_close(a.double(), w, rtol=1e-4, atol=1e-4, msg=f"{b} d{name}")


@pytest.mark.parametrize("lq", [1, 3, 16])
@pytest.mark.parametrize("window", [(-1, -1), (9, 0)])
@pytest.mark.parametrize("g", [4, 1])
def test_flash_attn_kvcache(lq, window, g):
    # test_flash_attn_kvcache: per-row cache_seqlens, the new keys written at cache_seqlens in
    # a longer (B, G, max_len, d) buffer, queries causal to their own row's keys; the
    # buffer's unused tail is never read. attnkit: the (strided) buffer view and a per-row
    # bool mask (B, 1, Lq, Lk) (flash-attn aligns causal to each row's own length)
    gen = torch.Generator().manual_seed(lq * 7 + g)
    b, h, d, cap = 3, 4, 16, 300
    cache_seqlens = torch.tensor([0, 5, 250])
    kbuf = torch.randn(b, g, cap, d, generator=gen)
    vbuf = torch.randn(b, g, cap, d, generator=gen)
    k_new, v_new = torch.randn(b, g, lq, d, generator=gen), torch.randn(b, g, lq, d, generator=gen)
    for i, n in enumerate(cache_seqlens.tolist()):  # flash-attn writes in place
        kbuf[i, :, n : n + lq], vbuf[i, :, n : n + lq] = k_new[i], v_new[i]
    lens = cache_seqlens + lq
    lk = int(lens.max())
    k, v = kbuf[:, :, :lk], vbuf[:, :, :lk]  # views of the buffer: strided caches
    q = torch.randn(b, h, lq, d, generator=gen)
    allowed = local_allowed(lq, lk, (window[0], 0), key_lens=lens, batch=b)
    want = attention_ref(q, k, v, allowed)
    got = run_backends(lambda be: grouped_query_attention(q, k, v, allowed, backend=be))
    assert "decode" in got or lq > 16  # the decode backend serves cache steps
    for be, out in got.items():
        torch.testing.assert_close(out.double(), want, rtol=TOL, atol=TOL, msg=be)
    # row by row (each row's own keys only) gives the same: the padding is never read
    for i, n in enumerate(lens.tolist()):
        row = grouped_query_attention(
            q[i : i + 1], k[i : i + 1, :, :n], v[i : i + 1, :, :n],
            window_mask((window[0], 0), True),
        )  # fmt: skip
        torch.testing.assert_close(row[0].double(), want[i], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("lq", [1, 4])
def test_flash_attn_kvcache_key_padding_equals_per_row_lengths(lq):
    # flash_attn_with_kvcache for one new token per row: attnkit's key_padding(lengths) with
    # bottom-right causal is the same mask (the query is the last key of its row), on the
    # decode backend and auto
    gen = torch.Generator().manual_seed(11)
    lens = torch.tensor([1, 40, 97, 13])
    b, lk = len(lens), 97
    q = torch.randn(b, 8, lq, 32, generator=gen)
    k, v = torch.randn(b, 2, lk, 32, generator=gen), torch.randn(b, 2, lk, 32, generator=gen)
    m = masks.key_padding(lens) & masks.causal("bottom_right")
    allowed = (
        local_allowed(lq, lk, (-1, 0), batch=b)
        & (torch.arange(lk) < lens.view(-1, 1))[:, None, None]
    )
    want = attention_ref(q, k, v, allowed)
    for be in ("auto", "decode", "math"):
        out = grouped_query_attention(q, k, v, m, backend=be)
        torch.testing.assert_close(out.double(), want, rtol=TOL, atol=TOL, msg=be)

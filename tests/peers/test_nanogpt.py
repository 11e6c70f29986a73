"""nanoGPT's ``model.py`` behaviour: ``CausalSelfAttention`` (c_attn split into q, k, v, heads
(B, nh, T, hs), causal softmax with ``1/sqrt(hs)``, dropout on the weights only while
training, c_proj) on attnkit's :class:`~attnkit.nn.MultiHeadAttention`, and the language
model's causality (a token never changes the logits before it; with a window, nor those more
than ``window`` tokens after it).

Reference: nanoGPT's "slow attention" path written here in float64 torch; tolerance 1e-10."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import masks
from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.nn import MultiHeadAttention

C, NH = 24, 4


def nanogpt_attention(x, c_attn_w, c_attn_b, c_proj_w, c_proj_b):
    """nanoGPT CausalSelfAttention.forward, manual implementation, eval mode."""
    b, t, c = x.shape
    q, k, v = (x @ c_attn_w.T + c_attn_b).split(C, dim=2)
    q, k, v = (z.view(b, t, NH, c // NH).transpose(1, 2) for z in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    bias = torch.tril(torch.ones(t, t)).view(1, 1, t, t)
    att = torch.softmax(att.masked_fill(bias == 0, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
    return y @ c_proj_w.T + c_proj_b


def attnkit_copy(c_attn_w, c_attn_b, c_proj_w, c_proj_b, dropout=0.0):
    m = MultiHeadAttention(C, NH, dropout=dropout, dtype=torch.float64)
    with torch.no_grad():
        for i, (w, b) in enumerate(zip(m.in_proj.weights(), m.in_proj.biases(), strict=True)):
            w.copy_(c_attn_w[i * C : (i + 1) * C])
            b.copy_(c_attn_b[i * C : (i + 1) * C])
        m.out_proj.weight.copy_(c_proj_w)
        m.out_proj.bias.copy_(c_proj_b)
    return m


def weights(seed):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(*s, generator=g, dtype=torch.float64) / 4
        for s in ((3 * C, C), (3 * C,), (C, C), (C,))
    ]


@pytest.mark.parametrize("t", [1, 7, 64])
def test_causal_self_attention_matches_nanogpt(t):
    w = weights(t)
    x = torch.randn(3, t, C, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    m = attnkit_copy(*w).eval()
    got, _ = m(x, mask=masks.causal())
    torch.testing.assert_close(got, nanogpt_attention(x, *w), rtol=1e-10, atol=1e-10)


def test_dropout_only_while_training():
    # nanoGPT: dropout_p=self.dropout if self.training else 0 (and attn_dropout in the slow path)
    w = weights(0)
    x = torch.randn(2, 9, C, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    m = attnkit_copy(*w, dropout=0.5)
    want = nanogpt_attention(x, *w)
    m.eval()
    torch.testing.assert_close(m(x, mask=masks.causal())[0], want, rtol=1e-10, atol=1e-10)
    m.train()
    torch.manual_seed(0)
    a = m(x, mask=masks.causal())[0]
    assert (a - want).abs().max() > 1e-3  # dropped weights change the output
    m.dropout = 0.0  # training with p = 0 is the eval result
    torch.testing.assert_close(m(x, mask=masks.causal())[0], want, rtol=1e-10, atol=1e-10)


@settings(max_examples=12, deadline=None)
@given(t=st.integers(2, 12), pos=st.data(), window=st.sampled_from([None, 0, 2]))
def test_lm_logits_never_see_later_tokens(t, pos, window):
    # nanoGPT's causal mask: changing token p changes no logits before p; with a local window
    # W none after p + W either (attnkit's window option: each token sees itself and W before)
    p = pos.draw(st.integers(0, t - 1))
    torch.manual_seed(3)
    cfg = LMConfig(vocab_size=11, d_model=16, nhead=2, num_layers=1, dim_feedforward=32,
                   dropout=0.0, window=window)  # fmt: skip
    lm = TransformerLM(cfg).double().eval()
    tokens = torch.randint(3, 11, (2, t), generator=torch.Generator().manual_seed(t))
    other = tokens.clone()
    other[:, p] = 3 + (other[:, p] - 3 + 1) % 8
    with torch.no_grad():
        a, b = lm(tokens), lm(other)
    same = (a - b).abs().amax(dim=(0, 2)) <= 1e-12  # (T,)
    assert same[:p].all()
    assert not same[p]
    if window is not None:  # one layer: position j sees p only when j - p <= window
        assert same[p + window + 1 :].all()

"""PyTorch ``test_nn.py`` / ``test_transformers.py`` cases: nn.MultiheadAttention and the
Transformer layers.

Ported from the peer's own suite and checked against torch's own math or an explicit float64
softmax (tests/peers/common.py); where attnkit differs by a documented convention, the test
asserts attnkit's documented behaviour and says so."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.nn import MultiHeadAttention
from tests.peers.common import close, rand


# ---------------------------------------------------------------------------------------------
# PyTorch test_nn.py / test_transformers.py: nn.MultiheadAttention
# ---------------------------------------------------------------------------------------------
def ported_mha(e, h, kdim=None, vdim=None, batch_first=True, bias=True, seed=0):
    torch.manual_seed(seed)
    t = torch.nn.MultiheadAttention(
        e, h, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first, dtype=torch.float64
    ).eval()
    a = MultiHeadAttention(
        e, h, kdim=kdim, vdim=vdim, bias=bias, batch_first=batch_first, dtype=torch.float64
    ).eval()
    with torch.no_grad():
        if t._qkv_same_embed_dim:
            wq, wk, wv = t.in_proj_weight.chunk(3)
        else:
            wq, wk, wv = t.q_proj_weight, t.k_proj_weight, t.v_proj_weight
        for mine, theirs in zip(a.in_proj.weights(), (wq, wk, wv), strict=True):
            mine.copy_(theirs)
        a.out_proj.weight.copy_(t.out_proj.weight)
        if bias:
            for mine, theirs in zip(a.in_proj.biases(), t.in_proj_bias.chunk(3), strict=True):
                mine.copy_(theirs)
            a.out_proj.bias.copy_(t.out_proj.bias)
    return t, a


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_mha_matches_torch(batch_first, bias):
    # test_nn.py test_multihead_attn_* (self and cross attention, batch_first both ways)
    t, a = ported_mha(12, 3, batch_first=batch_first, bias=bias)
    x = rand(2, 5, 12) if batch_first else rand(5, 2, 12)
    y = rand(2, 7, 12, seed=3) if batch_first else rand(7, 2, 12, seed=3)
    want, _ = t(x, y, y, need_weights=False)
    got, _ = a(x, y, y)
    close(got, want, torch.float64)


def test_mha_kdim_vdim():
    # test_nn.py test_multihead_attn_kdim_vdim / _in_proj_weight_none
    t, a = ported_mha(8, 2, kdim=5, vdim=3)
    x, kk, vv = rand(2, 4, 8), rand(2, 6, 5, seed=1), rand(2, 6, 3, seed=2)
    want, _ = t(x, kk, vv, need_weights=False)
    got, _ = a(x, kk, vv)
    close(got, want, torch.float64)


@pytest.mark.parametrize("average", [True, False])
def test_mha_key_padding_mask_and_weights(average):
    # test_nn.py test_multihead_attention key_padding_mask (True = ignore), need_weights with
    # average_attn_weights; attnkit converts through masks.from_key_padding_mask (documented).
    t, a = ported_mha(8, 2)
    x = rand(3, 5, 8)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[0, 3:] = True
    kpm[2, 1] = True
    want, want_w = t(x, x, x, key_padding_mask=kpm, average_attn_weights=average)
    got, w = a(
        x, mask=masks.from_key_padding_mask(kpm), return_weights=True, average_weights=average
    )
    close(got, want, torch.float64)
    close(w, want_w, torch.float64)


def test_mha_attn_mask_float_and_bool():
    # test_nn.py: attn_mask (L, S) bool (True = NOT allowed in torch) and float additive
    t, a = ported_mha(8, 4)
    x, y = rand(2, 5, 8), rand(2, 6, 8, seed=1)
    torch_bool = torch.zeros(5, 6, dtype=torch.bool)
    torch_bool[:, 4:] = True
    want, _ = t(x, y, y, attn_mask=torch_bool, need_weights=False)
    got, _ = a(x, y, y, mask=~torch_bool)
    close(got, want, torch.float64)
    fm = rand(5, 6, seed=9)
    want, _ = t(x, y, y, attn_mask=fm, need_weights=False)
    got, _ = a(x, y, y, mask=fm)
    close(got, want, torch.float64)


def test_mha_causal_with_padding_combined():
    # test_transformers.py: attn_mask + key_padding_mask merged
    t, a = ported_mha(8, 2)
    x = rand(2, 6, 8)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    causal_t = torch.ones(6, 6, dtype=torch.bool).triu(1)
    want, _ = t(x, x, x, attn_mask=causal_t, key_padding_mask=kpm, need_weights=False)
    got, _ = a(x, mask=masks.causal() & masks.from_key_padding_mask(kpm))
    close(got, want, torch.float64)


def test_mha_3d_attn_mask_is_refused():
    # test_nn.py: torch accepts a (B*H, L, S) attn_mask; attnkit documents that a 3-D tensor is
    # ambiguous and refuses it with a ValueError naming mask.
    _, a = ported_mha(8, 2)
    x = rand(2, 5, 8)
    with pytest.raises(ValueError, match="^mask"):
        a(x, mask=torch.ones(4, 5, 5, dtype=torch.bool))


def test_mha_functional_matches_torch():
    # test_nn.py: F.multi_head_attention_forward vs attnkit.multi_head_attention
    t, _ = ported_mha(8, 2)
    x = rand(2, 5, 8)
    wq, wk, wv = t.in_proj_weight.chunk(3)
    bq, bk, bv = t.in_proj_bias.chunk(3)
    want, want_w = t(x, x, x, average_attn_weights=False)
    got, w = attnkit.multi_head_attention(
        x, x, x, 2, wq, wk, wv, t.out_proj.weight, bq, bk, bv, t.out_proj.bias,
        return_weights=True,
    )  # fmt: skip
    close(got, want, torch.float64)
    close(w, want_w, torch.float64)


# ---------------------------------------------------------------------------------------------
# PyTorch test_transformers.py: TransformerEncoderLayer / Decoder / Transformer parity
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    # test_transformers.py test_transformerencoderlayer(_gelu): masks src_mask / padding
    torch.manual_seed(0)
    t = torch.nn.TransformerEncoderLayer(
        16, 4, 32, dropout=0.0, activation=activation, batch_first=True,
        norm_first=norm_first, dtype=torch.float64,
    ).eval()  # fmt: skip
    a = attnkit.nn.TransformerEncoderLayer.from_torch(t).eval()
    x = rand(2, 7, 16)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 5:] = True
    cm = torch.nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64)
    close(a(x), t(x), torch.float64)
    close(a(x, masks.from_key_padding_mask(kpm)), t(x, src_key_padding_mask=kpm), torch.float64)
    close(a(x, masks.causal()), t(x, src_mask=cm, is_causal=True), torch.float64)
    close(a(x, cm), t(x, src_mask=cm), torch.float64)


def test_transformer_matches_torch():
    # test_transformers.py test_transformer_args_check / nn.Transformer parity with tgt_mask
    torch.manual_seed(1)
    t = torch.nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, batch_first=True, dtype=torch.float64)
    t = t.eval()
    a = attnkit.nn.Transformer.from_torch(t).eval()
    src, tgt = rand(2, 5, 16), rand(2, 7, 16, seed=1)
    cm = torch.nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64)
    close(a(src, tgt, tgt_mask=masks.causal()), t(src, tgt, tgt_mask=cm), torch.float64)


@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_from_torch(batch_first):
    torch.manual_seed(2)
    t = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first, dtype=torch.float64).eval()
    a = MultiHeadAttention.from_torch(t).eval()
    x = rand(2, 7, 16) if batch_first else rand(7, 2, 16)
    close(a(x)[0], t(x, x, x)[0], torch.float64)


@pytest.mark.parametrize("option", ["add_bias_kv", "add_zero_attn"])
def test_mha_from_torch_unsupported_options_refused(option):
    # test_nn.py test_multihead_attn_add_bias_kv / add_zero_attn: attnkit has no equivalent and
    # refuses such a module with a ValueError (documented in from_torch).
    t = torch.nn.MultiheadAttention(16, 4, batch_first=True, **{option: True})
    with pytest.raises(ValueError, match=option):
        MultiHeadAttention.from_torch(t)

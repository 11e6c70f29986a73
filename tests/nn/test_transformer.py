"""Transformer layers and stacks against torch.nn's, incremental decoding against the full
causal forward, causality by autograd, and input validation.

Tolerance: float32 max |ours - torch| <= 1e-5 * max |torch| (eval mode). torch's encoder
"fast path" (nested tensors, zeros at padded positions) is switched off with
``torch.backends.mha.set_fastpath_enabled(False)`` except in the test that checks it on the
non-padded positions.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit import masks
from attnkit.nn.cache import DecoderCache
from attnkit.nn.transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from tests.support.numerics import max_rel_err

B, S, T, E, H, FF = 3, 9, 7, 20, 4, 33
SRC_LENGTHS, TGT_LENGTHS = [9, 5, 2], [7, 7, 4]


def torch_padding(lengths: list[int], n: int) -> torch.Tensor:
    """torch-style key padding mask (B, n): True = ignore."""
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]


def float_padding(lengths: list[int], n: int) -> torch.Tensor:
    """The same padding as an additive float mask (B, n): -inf = ignore (torch wants the
    padding mask to have the type of a float attn_mask)."""
    return torch.zeros(len(lengths), n).masked_fill(torch_padding(lengths, n), float("-inf"))


def torch_causal(n: int) -> torch.Tensor:
    """torch's float causal mask (n, n): 0 on and below the diagonal, -inf above."""
    return nn.Transformer.generate_square_subsequent_mask(n)


def bf(x: torch.Tensor, batch_first: bool) -> torch.Tensor:
    return x if batch_first else x.transpose(0, 1).contiguous()


def randomize_norms(module: nn.Module) -> None:
    """torch initialises LayerNorms to (1, 0); give them values that a wrong copy would show."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                if m.weight is not None:
                    m.weight.uniform_(0.5, 1.5)
                if m.bias is not None:
                    m.bias.normal_(std=0.2)
            if isinstance(m, nn.MultiheadAttention) and m.in_proj_bias is not None:
                m.in_proj_bias.normal_(std=0.2)


pytestmark = [
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True"),
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors"),
]


@pytest.fixture
def no_fastpath():
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(prev)


# (norm_first, activation, batch_first): every pair of options appears in some configuration
CONFIGS = [
    (False, "relu", True),
    (True, "gelu", False),
    (True, "relu", True),
    (False, "gelu", True),
]


# ---------------------------------------------------------------------------------------------
# from_torch
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("norm_first", "activation", "batch_first"), CONFIGS)
def test_encoder_layer_from_torch(no_fastpath, norm_first, activation, batch_first, causal):
    torch.manual_seed(0)
    m = nn.TransformerEncoderLayer(
        E,
        H,
        FF,
        dropout=0.1,
        activation=activation,
        batch_first=batch_first,
        norm_first=norm_first,
    ).eval()
    randomize_norms(m)
    ours = TransformerEncoderLayer.from_torch(m)
    assert not ours.training and ours.activation == activation
    src = bf(torch.randn(B, S, E), batch_first)
    pad = torch_padding(SRC_LENGTHS, S)
    torch_pad = float_padding(SRC_LENGTHS, S) if causal else pad
    ref = m(src, src_mask=torch_causal(S) if causal else None, src_key_padding_mask=torch_pad)
    mask = masks.from_key_padding_mask(pad)
    if causal:
        mask = masks.causal() & mask
    assert max_rel_err(ours(src, mask), ref) <= 1e-5
    assert (ours(src) - ref).abs().max() > 1e-3  # the mask matters


@pytest.mark.parametrize(("norm_first", "activation", "batch_first"), CONFIGS)
def test_decoder_layer_from_torch(norm_first, activation, batch_first):
    torch.manual_seed(1)
    m = nn.TransformerDecoderLayer(
        E,
        H,
        FF,
        dropout=0.1,
        activation=activation,
        batch_first=batch_first,
        norm_first=norm_first,
    ).eval()
    randomize_norms(m)
    ours = TransformerDecoderLayer.from_torch(m)
    tgt = bf(torch.randn(B, T, E), batch_first)
    mem = bf(torch.randn(B, S, E), batch_first)
    tpad, spad = torch_padding(TGT_LENGTHS, T), torch_padding(SRC_LENGTHS, S)
    ref = m(
        tgt,
        mem,
        tgt_mask=torch_causal(T),
        tgt_key_padding_mask=float_padding(TGT_LENGTHS, T),
        memory_key_padding_mask=spad,
    )
    out = ours(
        tgt,
        mem,
        masks.causal() & masks.from_key_padding_mask(tpad),
        masks.from_key_padding_mask(spad),
    )
    assert max_rel_err(out, ref) <= 1e-5


def test_stacks_from_torch(no_fastpath):
    torch.manual_seed(2)
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(E, H, FF, batch_first=True),
        2,
        nn.LayerNorm(E),
        enable_nested_tensor=False,
    ).eval()
    dec = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(E, H, FF, batch_first=True), 3, nn.LayerNorm(E)
    ).eval()
    randomize_norms(enc)
    randomize_norms(dec)
    src, tgt = torch.randn(B, S, E), torch.randn(B, T, E)
    spad = torch_padding(SRC_LENGTHS, S)
    ref_mem = enc(src, src_key_padding_mask=spad)
    ref = dec(tgt, ref_mem, tgt_mask=torch_causal(T), memory_key_padding_mask=spad)
    a_enc, a_dec = TransformerEncoder.from_torch(enc), TransformerDecoder.from_torch(dec)
    assert (a_enc.num_layers, a_dec.num_layers) == (2, 3)
    mem = a_enc(src, masks.from_key_padding_mask(spad))
    assert max_rel_err(mem, ref_mem) <= 1e-5
    assert max_rel_err(a_dec(tgt, mem, masks.causal(), masks.key_padding(SRC_LENGTHS)), ref) <= 1e-5


@pytest.mark.parametrize(
    ("bias", "batch_first", "norm_first"), [(True, False, False), (False, True, True)]
)
def test_transformer_from_torch(no_fastpath, bias, batch_first, norm_first):
    torch.manual_seed(3)
    m = nn.Transformer(
        E, H, 2, 2, FF, bias=bias, batch_first=batch_first, norm_first=norm_first
    ).eval()
    randomize_norms(m)
    ours = Transformer.from_torch(m)
    src, tgt = bf(torch.randn(B, S, E), batch_first), bf(torch.randn(B, T, E), batch_first)
    spad = torch_padding(SRC_LENGTHS, S)
    ref = m(
        src,
        tgt,
        tgt_mask=torch_causal(T),
        src_key_padding_mask=spad,
        tgt_key_padding_mask=float_padding(TGT_LENGTHS, T),
        memory_key_padding_mask=spad,
    )
    out = ours(
        src,
        tgt,
        src_mask=masks.key_padding(SRC_LENGTHS),
        tgt_mask=masks.causal() & masks.key_padding(TGT_LENGTHS),
        memory_mask=masks.key_padding(SRC_LENGTHS),
    )
    assert max_rel_err(out, ref) <= 1e-5


def test_transformer_matches_torch_parameter_count():
    ours = Transformer(24, 4, 2, 3, 40, bias=False)
    ref = nn.Transformer(24, 4, 2, 3, 40, bias=False)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


def test_encoder_with_torch_fastpath_on_non_padded_positions():
    """With torch's fast path (nested tensors in eval/no-grad), torch returns zeros at padded
    positions; the non-padded positions must still agree."""
    torch.manual_seed(4)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, FF, batch_first=True), 2).eval()
    ours = TransformerEncoder.from_torch(enc)
    src, pad = torch.randn(B, S, E), torch_padding(SRC_LENGTHS, S)
    with torch.no_grad():
        ref = enc(src, src_key_padding_mask=pad)
        out = ours(src, masks.from_key_padding_mask(pad))
    assert torch.count_nonzero(ref[pad]) == 0  # torch really took its nested-tensor path
    keep = ~pad
    assert max_rel_err(out[keep], ref[keep]) <= 1e-5


# ---------------------------------------------------------------------------------------------
# incremental decoding
# ---------------------------------------------------------------------------------------------
def _decode_in_chunks(step, tgt, chunks):
    outs, pos = [], 0
    for n in chunks:
        outs.append(step(tgt[:, pos : pos + n]))
        pos += n
    assert pos == tgt.shape[1]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("chunks", [[1] * 13, [5, 1, 7]])
def test_decoder_layer_cache_matches_full_forward(norm_first, chunks):
    torch.manual_seed(5)
    layer = TransformerDecoderLayer(E, H, FF, norm_first=norm_first).eval()
    tgt, mem = torch.randn(B, 13, E), torch.randn(B, S, E)
    tgt_pad, mem_mask = masks.key_padding([13, 10, 6]), masks.key_padding(SRC_LENGTHS)
    full = layer(tgt, mem, masks.causal() & tgt_pad, mem_mask)
    cache = layer.new_cache()
    step = lambda x: layer(x, mem, masks.causal("bottom_right") & tgt_pad, mem_mask, cache)  # noqa: E731
    assert max_rel_err(_decode_in_chunks(step, tgt, chunks), full) <= 1e-5
    assert cache.self_attn.length == 13 and cache.cross_attn.length == S


def test_decoder_cache_matches_full_forward():
    torch.manual_seed(6)
    tr = Transformer(E, H, 2, 3, FF).eval()
    src, tgt = torch.randn(B, S, E), torch.randn(B, 11, E)
    src_mask = masks.key_padding(SRC_LENGTHS)
    memory = tr.encode(src, src_mask)
    full = tr(src, tgt, src_mask, masks.causal(), src_mask)
    cache = tr.new_cache()
    assert isinstance(cache, DecoderCache) and len(cache.layers) == 3
    step = lambda x: tr.decode(x, memory, None, src_mask, cache)  # noqa: E731 - 1 token: no mask
    assert max_rel_err(_decode_in_chunks(step, tgt, [1] * 11), full) <= 1e-5
    assert cache.length == 11
    # a cache built lazily (DecoderCache.empty) works the same way
    lazy = DecoderCache.empty(3)
    step = lambda x: tr.decode(x, memory, masks.causal("bottom_right"), src_mask, lazy)  # noqa: E731
    assert max_rel_err(_decode_in_chunks(step, tgt, [4, 7]), full) <= 1e-5


# ---------------------------------------------------------------------------------------------
# causality and validation
# ---------------------------------------------------------------------------------------------
def _assert_causal(fn, x):
    out = fn(x)
    r = torch.randn(out.shape[-1])  # a plain sum of a LayerNorm output has zero gradient
    for i in range(x.shape[1]):
        (g,) = torch.autograd.grad(
            out[:, i] @ r, x, grad_outputs=torch.ones(x.shape[0]), retain_graph=True
        )
        assert torch.count_nonzero(g[:, i + 1 :]) == 0, f"position {i} depends on later inputs"
        assert (g[:, : i + 1].abs().sum(-1) > 0).all(), f"position {i} ignores earlier inputs"


def test_causal_mask_blocks_gradients_from_later_positions():
    torch.manual_seed(7)
    tr = Transformer(E, H, 1, 2, FF, dropout=0.0)
    src = torch.randn(2, S, E)
    tgt = torch.randn(2, T, E, requires_grad=True)
    _assert_causal(lambda t: tr(src, t, tgt_mask=masks.causal()), tgt)
    enc = TransformerEncoderLayer(E, H, FF, dropout=0.0, norm_first=True)
    _assert_causal(lambda x: enc(x, masks.causal()), torch.randn(2, S, E, requires_grad=True))


def test_dropout_only_in_training_mode():
    torch.manual_seed(8)
    layer = TransformerEncoderLayer(E, H, FF, dropout=0.5)
    x = torch.randn(B, S, E)
    assert (layer(x) - layer(x)).abs().max() > 1e-3
    layer.eval()
    assert torch.equal(layer(x), layer(x))


def test_validation_errors():
    with pytest.raises(ValueError, match="d_model: expected a multiple of nhead=3"):
        TransformerEncoderLayer(20, 3)
    with pytest.raises(ValueError, match="activation: expected one of 'relu', 'gelu'"):
        TransformerDecoderLayer(E, H, activation="tanh")
    with pytest.raises(ValueError, match="num_layers"):
        TransformerEncoder(TransformerEncoderLayer(E, H), 0)
    layer_a, layer_b = TransformerDecoderLayer(E, H), TransformerDecoderLayer(E, H)
    tgt, mem = torch.randn(2, 1, E), torch.randn(2, S, E)
    with pytest.raises(ValueError, match=r"tgt: expected shape \(B, L, d_model\) with d_model=20"):
        layer_a(torch.randn(2, 1, E + 1), mem)
    with pytest.raises(ValueError, match="memory: expected shape"):
        layer_a(tgt, torch.randn(2, S, 7))
    cache = layer_a.new_cache()
    layer_a(tgt, mem, cache=cache)
    with pytest.raises(ValueError, match="cache: this KVCache belongs to another"):
        layer_b(tgt, mem, cache=cache)
    with pytest.raises(TypeError, match="cache: expected a DecoderLayerCache"):
        layer_a(tgt, mem, cache=DecoderCache([cache]))
    dec = TransformerDecoder(layer_a, 2)
    with pytest.raises(ValueError, match="cache: holds 3 layer caches"):
        dec(tgt, mem, cache=DecoderCache.empty(3))
    enc = TransformerEncoder(TransformerEncoderLayer(E, H), 2)
    with pytest.raises(ValueError, match="mask: expected a shape broadcastable"):
        enc(torch.randn(2, S, E), torch.ones(S, S + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="tgt: batch size 3 differs"):
        Transformer(E, H, 1, 1, FF)(torch.randn(2, S, E), torch.randn(3, T, E))

"""Bad arguments to the nn modules owned by the Transformer layers, SelfAttention and the
additive / general attention modules: the exception type, a message that starts with the
argument name the caller used (``src``, ``memory``, ``tgt_mask``, not the inner ``query`` /
``key`` / ``mask``), raised before torch sees the value and before any work (no projection, no
attention, no normalisation: tests/support/no_work.py).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as torch_F

from attnkit import masks as M
from attnkit.nn import (
    AdditiveAttention,
    GeneralAttention,
    SelfAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from tests.support.no_work import no_work

E, H, FF, B, S, T = 8, 2, 16, 2, 5, 3

# ---------------------------------------------------------------------------------------------
# constructors
# ---------------------------------------------------------------------------------------------
LAYER_BAD = [  # (keyword, value, exception, name in the message)
    ("dim_feedforward", -1, ValueError, "dim_feedforward"),
    ("dim_feedforward", 0, ValueError, "dim_feedforward"),
    ("dim_feedforward", 2.5, TypeError, "dim_feedforward"),
    ("dtype", torch.int64, ValueError, "dtype"),
    ("dtype", 3, TypeError, "dtype"),
    ("dtype", "float32", TypeError, "dtype"),
    ("device", "nope", ValueError, "device"),
    ("device", 3, TypeError, "device"),
    ("bias", "no", TypeError, "bias"),
    ("norm_first", "yes", TypeError, "norm_first"),
    ("batch_first", 1, TypeError, "batch_first"),
    ("nhead", True, TypeError, "nhead"),
    ("nhead", 0, ValueError, "nhead"),
    ("nhead", 3, ValueError, "d_model"),
    ("d_model", True, TypeError, "d_model"),
    ("layer_norm_eps", -1, ValueError, "layer_norm_eps"),
    ("layer_norm_eps", float("nan"), ValueError, "layer_norm_eps"),
    ("layer_norm_eps", "1e-5", TypeError, "layer_norm_eps"),
    ("dropout", 1.0, ValueError, "dropout"),
    ("dropout", -0.1, ValueError, "dropout"),
    ("dropout", True, TypeError, "dropout"),
    ("activation", "tanh", ValueError, "activation"),
    ("activation", None, TypeError, "activation"),
    ("activation", torch_F.relu, TypeError, "activation"),
]
LAYERS = {
    "encoder layer": TransformerEncoderLayer,
    "decoder layer": TransformerDecoderLayer,
    "transformer": lambda **kw: Transformer(num_encoder_layers=1, num_decoder_layers=1, **kw),
}


def _check(call, exc, name):
    with no_work() as seen:
        with pytest.raises(exc) as info:
            call()
    msg = str(info.value)
    assert re.match(rf"{re.escape(name)}: ", msg), f"message should start with {name!r}: {msg}"
    assert not seen, f"work done before the error: {seen}"


@pytest.mark.parametrize("module", list(LAYERS))
@pytest.mark.parametrize(
    "key,value,exc,name", LAYER_BAD, ids=[f"{c[0]}={c[1]!r}" for c in LAYER_BAD]
)
def test_layer_constructors(module, key, value, exc, name):
    kw = dict(d_model=E, nhead=H, dim_feedforward=FF) | {key: value}
    _check(lambda: LAYERS[module](**kw), exc, name)


OTHER_BAD = [
    ("layers 0", lambda: Transformer(E, H, 0, 1, FF), ValueError, "num_encoder_layers"),
    ("layers bool", lambda: Transformer(E, H, 1, True, FF), TypeError, "num_decoder_layers"),
    (
        "encoder num_layers 0",
        lambda: TransformerEncoder(TransformerEncoderLayer(E, H, FF), 0),
        ValueError,
        "num_layers",
    ),
    (
        "decoder num_layers float",
        lambda: TransformerDecoder(TransformerDecoderLayer(E, H, FF), 2.0),
        TypeError,
        "num_layers",
    ),
    (
        "encoder norm",
        lambda: TransformerEncoder(TransformerEncoderLayer(E, H, FF), 1, norm="layer"),
        TypeError,
        "norm",
    ),
    ("self-attention d_k 0", lambda: SelfAttention(8, 0, 4), ValueError, "d_k"),
    ("self-attention d_model bool", lambda: SelfAttention(True, 4, 4), TypeError, "d_model"),
    ("self-attention bias str", lambda: SelfAttention(8, 4, 4, bias="no"), TypeError, "bias"),
    ("additive hidden 0", lambda: AdditiveAttention(4, 4, 0), ValueError, "hidden_dim"),
    ("additive value_dim", lambda: AdditiveAttention(4, 4, 3, True), TypeError, "value_dim"),
    ("general query_dim", lambda: GeneralAttention(-2, 4), ValueError, "query_dim"),
]


@pytest.mark.parametrize("call,exc,name", [c[1:] for c in OTHER_BAD], ids=[c[0] for c in OTHER_BAD])
def test_other_constructors(call, exc, name):
    _check(call, exc, name)


# ---------------------------------------------------------------------------------------------
# forwards
# ---------------------------------------------------------------------------------------------
torch.manual_seed(0)
enc = TransformerEncoderLayer(E, H, FF, dropout=0.0)
dec = TransformerDecoderLayer(E, H, FF, dropout=0.0)
enc_stack = TransformerEncoder(enc, 2)
dec_stack = TransformerDecoder(dec, 2)
model = Transformer(E, H, 1, 1, FF, dropout=0.0)
sa = SelfAttention(E, 4, 4)
add = AdditiveAttention(4, 6, 5, value_dim=3)
gen = GeneralAttention(4, 6)

src, tgt, mem = torch.randn(B, S, E), torch.randn(B, T, E), torch.randn(B, S, E)
ones = lambda *s: torch.ones(*s, dtype=torch.bool)  # noqa: E731
filled = dec.new_cache()
dec(tgt, mem, M.causal("bottom_right"), cache=filled)  # 3 cached target positions
q4, k6, v3 = torch.randn(B, 3, 4), torch.randn(B, 7, 6), torch.randn(B, 7, 3)

FORWARD_BAD = [
    # encoder layer and stack
    ("enc src float64", lambda: enc(src.double()), TypeError, "src"),
    ("enc src int64", lambda: enc(src.long()), TypeError, "src"),
    ("enc src width", lambda: enc(src[..., :7]), ValueError, "src"),
    ("enc src rank", lambda: enc(src[0]), ValueError, "src"),
    ("enc src empty", lambda: enc(src[:, :0]), ValueError, "src"),
    ("enc mask shape", lambda: enc(src, ones(S, S + 1)), ValueError, "mask"),
    ("enc mask 3-D", lambda: enc(src, ones(B, S, S)), ValueError, "mask"),
    ("enc stack mask", lambda: enc_stack(src, M.key_padding([1, 2, 3])), ValueError, "mask"),
    ("enc stack src", lambda: enc_stack([src]), TypeError, "src"),
    # decoder layer and stack
    ("dec tgt float64", lambda: dec(tgt.double(), mem), TypeError, "tgt"),
    ("dec memory float64", lambda: dec(tgt, mem.double()), TypeError, "memory"),
    ("dec memory int", lambda: dec(tgt, mem.long()), TypeError, "memory"),
    ("dec memory batch", lambda: dec(tgt, mem[:1]), ValueError, "memory"),
    ("dec memory width", lambda: dec(tgt, mem[..., :4]), ValueError, "memory"),
    ("dec tgt_mask", lambda: dec(tgt, mem, ones(T, S)), ValueError, "tgt_mask"),
    ("dec memory_mask", lambda: dec(tgt, mem, None, ones(T, T)), ValueError, "memory_mask"),
    ("dec memory_mask 3-D", lambda: dec(tgt, mem, None, ones(B, T, S)), ValueError, "memory_mask"),
    ("dec memory_mask type", lambda: dec(tgt, mem, None, "pad"), TypeError, "memory_mask"),
    ("dec cache type", lambda: dec(tgt, mem, cache={}), TypeError, "cache"),
    (
        "dec top-left causal with a cache",
        lambda: dec(tgt[:, :1], mem, M.causal(), cache=filled),
        ValueError,
        "tgt_mask",
    ),
    (
        "dec cached memory length",
        lambda: dec(tgt[:, :1], mem[:, :4], cache=filled),
        ValueError,
        "memory",
    ),
    ("dec stack tgt_mask", lambda: dec_stack(tgt, mem, ones(T, T + 1)), ValueError, "tgt_mask"),
    ("dec stack memory", lambda: dec_stack(tgt, mem.double()), TypeError, "memory"),
    # encoder-decoder
    ("model src float64", lambda: model(src.double(), tgt), TypeError, "src"),
    ("model tgt int", lambda: model(src, tgt.long()), TypeError, "tgt"),
    ("model batch", lambda: model(src, tgt[:1]), ValueError, "tgt"),
    ("model src_mask", lambda: model(src, tgt, ones(T, T)), ValueError, "src_mask"),
    ("model tgt_mask", lambda: model(src, tgt, None, ones(S, S)), ValueError, "tgt_mask"),
    (
        "model memory_mask",
        lambda: model(src, tgt, None, None, ones(S, T)),
        ValueError,
        "memory_mask",
    ),
    ("model encode src_mask", lambda: model.encode(src, ones(S, 2)), ValueError, "src_mask"),
    # single-head modules
    ("self-attention x float64", lambda: sa(src.double()), TypeError, "x"),
    ("self-attention x int", lambda: sa(src.long()), TypeError, "x"),
    ("self-attention mask", lambda: sa(src, ones(B, 4, 4)), ValueError, "mask"),
    ("self-attention return_weights", lambda: sa(src, None, "yes"), TypeError, "return_weights"),
    ("additive query float64", lambda: add(q4.double(), k6, v3), TypeError, "query"),
    ("additive key batch", lambda: add(q4, k6[:1], v3[:1]), ValueError, "key"),
    ("additive value Lk", lambda: add(q4, k6, v3[:, :5]), ValueError, "value"),
    ("additive value width", lambda: add(q4, k6, k6), ValueError, "value"),
    ("additive mask", lambda: add(q4, k6, v3, ones(3, 6)), ValueError, "mask"),
    (
        "additive return_weights",
        lambda: add(q4, k6, v3, return_weights=1),
        TypeError,
        "return_weights",
    ),
    ("general key float64", lambda: gen(q4, k6.double()), TypeError, "key"),
    ("general key int", lambda: gen(q4, k6.long()), TypeError, "key"),
]


@pytest.mark.parametrize(
    "call,exc,name", [c[1:] for c in FORWARD_BAD], ids=[c[0] for c in FORWARD_BAD]
)
def test_forward_bad_input(call, exc, name):
    _check(call, exc, name)


def test_cache_unchanged_by_a_refused_call():
    before = filled.self_attn.size
    with pytest.raises(ValueError, match="^tgt_mask: "):
        dec(tgt[:, :1], mem, M.causal(), cache=filled)
    assert filled.self_attn.size == before

"""Bad constructor arguments to attnkit.nn layers (and bad forward inputs / cache indices),
drawn at random: a small valid constructor call with one argument made wrong must raise the
ValueError/TypeError naming that argument (tests/fuzz/errors.py), before building anything."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnkit import nn as N
from tests.fuzz.errors import expect_error
from tests.fuzz.profiles import budget

V, T = ValueError, TypeError

POS_INT = [(0, V), (-1, V), (True, T), (2.5, T), ("4", T), (None, T), (10**30, V)]
PROB = [(-0.1, V), (1.5, V), (math.nan, V), ("0.1", T), (True, T), (None, T)]
FLAG = [("no", T), ("yes", T), (1, T), (None, T), (0.0, T)]
DTYPE = [(torch.int64, V), (torch.bool, V), ("float32", T), (3, T)]
DEVICE = [("nope", V), (3, T), ("cuda:99", V)]
EPS = [(-1.0, V), (0.0, V), (math.nan, V), (math.inf, V), ("1e-5", T), (True, T)]

_LAYER = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0)
_LAYER_BAD = dict(
    d_model=POS_INT, nhead=POS_INT + [(3, V)], dim_feedforward=POS_INT, dropout=PROB,
    activation=[("tanhh", V), (3, T), (None, T)], layer_norm_eps=EPS, batch_first=FLAG,
    norm_first=FLAG, bias=FLAG, device=DEVICE, dtype=DTYPE,
)  # fmt: skip
# constructor -> (valid keyword arguments, {argument: [(bad value, exception)]})
LAYERS = {
    "MultiHeadAttention": (
        N.MultiHeadAttention,
        dict(embed_dim=8, num_heads=2),
        dict(embed_dim=POS_INT, num_heads=POS_INT + [(3, V)], kdim=POS_INT[:-2],
             vdim=POS_INT[:-2], num_kv_heads=POS_INT[:-2] + [(3, V)], bias=FLAG, dropout=PROB,
             batch_first=FLAG, device=DEVICE, dtype=DTYPE),
    ),
    "TransformerEncoderLayer": (N.TransformerEncoderLayer, _LAYER, _LAYER_BAD),
    "TransformerDecoderLayer": (N.TransformerDecoderLayer, _LAYER, _LAYER_BAD),
    "Transformer": (
        N.Transformer,
        dict(_LAYER, num_encoder_layers=1, num_decoder_layers=1),
        dict(_LAYER_BAD, num_encoder_layers=POS_INT, num_decoder_layers=POS_INT),
    ),
    "AdditiveAttention": (
        N.AdditiveAttention,
        dict(query_dim=3, key_dim=4, hidden_dim=5),
        dict(query_dim=POS_INT, key_dim=POS_INT, hidden_dim=POS_INT, value_dim=POS_INT[:-2]),
    ),
    "GeneralAttention": (N.GeneralAttention, dict(query_dim=3, key_dim=4),
                         dict(query_dim=POS_INT, key_dim=POS_INT)),
    "SelfAttention": (N.SelfAttention, dict(d_model=6, d_k=4, d_v=3),
                      dict(d_model=POS_INT, d_k=POS_INT, d_v=POS_INT, bias=FLAG)),
    "SinusoidalPositionalEncoding": (
        N.SinusoidalPositionalEncoding, dict(d_model=8, max_len=16),
        dict(d_model=POS_INT, max_len=POS_INT, dropout=PROB),
    ),
    "LearnedPositionalEmbedding": (N.LearnedPositionalEmbedding, dict(max_len=16, d_model=8),
                                   dict(max_len=POS_INT, d_model=POS_INT)),
    "RotaryEmbedding": (
        N.RotaryEmbedding, dict(head_dim=8),
        dict(head_dim=POS_INT + [(7, V)], base=[(1.0, V), (0.5, V), (math.nan, V), ("1e4", T)]),
    ),
    "ALiBi": (N.ALiBi, dict(num_heads=4), dict(num_heads=POS_INT)),
}  # fmt: skip


def _calls():
    """Method calls on built objects: (label, make object, method, kwargs, bad arg, values)."""
    rot = (lambda: N.RotaryEmbedding(4), "cos_sin", dict(length=3))
    out = [(*rot, "length", [(-3, V), (2.5, T), (True, T), ("3", T), (10**30, V)])]
    out.append((lambda: N.RotaryEmbedding(4), "cos_sin", dict(length=3), "offset",
                [(-1, V), (1.5, T), (None, T)]))  # fmt: skip
    mha = lambda: N.MultiHeadAttention(8, 2)  # noqa: E731
    x = torch.randn(2, 3, 8)
    out.append(
        (
            mha,
            "forward",
            dict(query=x),
            "query",
            [(x.double(), T), (x.long(), T), (x[0, 0], V), (x[..., :5], V), (x.numpy(), T)],
        )
    )
    out.append(
        (
            mha,
            "forward",
            dict(query=x, key=x, value=x),
            "key",
            [(x.double(), T), (x[:1], V), (x[..., :5], V), ([1.0], T)],
        )
    )
    out.append(
        (mha, "forward", dict(query=x, key=x, value=x), "return_weights", [(1, T), ("yes", T)])
    )
    enc = lambda: N.TransformerEncoderLayer(8, 2, 16, 0.0)  # noqa: E731
    dec = lambda: N.TransformerDecoderLayer(8, 2, 16, 0.0)  # noqa: E731
    bad_x = [(x.double(), T), (x.long(), T), (x[0, 0], V), (x[..., :5], V), ([1.0], T)]
    out.append((enc, "forward", dict(src=x), "src", bad_x))
    out.append((dec, "forward", dict(tgt=x, memory=x), "tgt", bad_x))
    out.append((dec, "forward", dict(tgt=x, memory=x), "memory", bad_x[:2] + bad_x[3:]))
    out.append((enc, "forward", dict(src=x), "mask", [(torch.ones(4, 4) > 0, V), ("x", T)]))
    return out


CALLS = _calls()
# a head count that does not divide the width: the width is as much to blame
ALSO = {"num_heads": ("embed_dim",), "nhead": ("d_model",), "num_kv_heads": ("num_heads",)}


@st.composite
def bad_constructions(draw):
    name = draw(st.sampled_from(sorted(LAYERS)))
    cls, good, bad = LAYERS[name]
    arg = draw(st.sampled_from(sorted(bad)))
    value, exc = draw(st.sampled_from(bad[arg]))
    kw = {**good, arg: value}
    return f"{name}({arg}={value!r})", lambda: cls(**kw), exc, (arg, *ALSO.get(arg, ()))


@st.composite
def bad_method_calls(draw):
    make, method, good, arg, values = draw(st.sampled_from(CALLS))
    value, exc = draw(st.sampled_from(values))
    kw = {**good, arg: value}
    shown = (
        f"tensor{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else value
    )
    return f"{method}({arg}={shown!r})", lambda: getattr(make(), method)(**kw), exc, arg


@budget("invalid_nn")
@given(case=st.one_of(bad_constructions(), bad_method_calls()))
def test_bad_nn_argument_names_it(case):
    label, thunk, exc, name = case
    expect_error(thunk, exc, name, label)


@budget("reorder")
@given(
    batch=st.integers(1, 4),
    index=st.one_of(
        st.tuples(st.just("range"), st.integers(-3, 9)),
        st.sampled_from([("float", None), ("list", None), ("bool", None), ("2d", None),
                         ("empty", None)]),
    ),
)  # fmt: skip
def test_kv_cache_reorder_checks_its_index(batch, index):
    """KVCache.reorder refuses an index that is not a 1-d int tensor of rows in [0, batch)."""
    mha = N.MultiHeadAttention(4, 2)
    cache = mha.new_cache()
    mha(torch.randn(batch, 2, 4), cache=cache)
    kind, n = index
    idx = {"float": torch.zeros(batch), "list": [0] * batch, "bool": torch.ones(batch) > 0,
           "2d": torch.zeros(1, batch, dtype=torch.long),
           "empty": torch.zeros(0, dtype=torch.long)}.get(kind)  # fmt: skip
    if kind == "range":
        if 0 <= n < batch:
            cache.reorder(torch.full((batch,), n))  # a valid index works
            return
        idx = torch.full((batch,), n)
    exc = T if kind in ("float", "list", "bool") else V
    expect_error(lambda: cache.reorder(idx), exc, "index", f"reorder({kind} {n}) batch={batch}")

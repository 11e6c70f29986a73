"""TransformerEncoderLayer options that BERT's blocks use: ``forward(..., return_weights=True)``
(the output equals torch's layer, float64 rel. err <= 1e-10; the weights equal softmax(q kᵀ /
sqrt(d) + mask) computed here from the layer's projection weights), ``attention_dropout`` and
``activation_dropout``, and their argument checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnkit import masks as M
from attnkit.nn import TransformerEncoderLayer
from tests.support.numerics import rel_err

E, H, FF, B, S = 12, 3, 20, 2, 7


def _weights(layer: TransformerEncoderLayer, x: torch.Tensor, allowed: torch.Tensor):
    """softmax(q kᵀ / sqrt(d) + mask) from the layer's own q/k projections: (B, H, S, S)."""
    a = layer.self_attn
    d = E // H
    (wq, wk, _), (bq, bk, _) = a.in_proj.weights(), a.in_proj.biases()
    q = (x @ wq.T + bq).reshape(B, S, H, d).transpose(1, 2)
    k = (x @ wk.T + bk).reshape(B, S, H, d).transpose(1, 2)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    return torch.softmax(s.masked_fill(~allowed, -math.inf), -1)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_return_weights_with_output_equal_to_torch(norm_first, activation):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(
        E, H, FF, dropout=0.0, activation=activation, batch_first=True,
        norm_first=norm_first, dtype=torch.float64,
    ).eval()  # fmt: skip
    layer = TransformerEncoderLayer.from_torch(ref)
    x = torch.randn(B, S, E, dtype=torch.float64)
    lengths = torch.tensor([S, 4])
    pad = torch.arange(S)[None, :] >= lengths[:, None]  # torch: True = padding
    out, w = layer(x, M.key_padding(lengths), return_weights=True)
    want = ref(x, src_key_padding_mask=pad)
    assert rel_err(out, want.detach()) <= 1e-10
    assert rel_err(layer(x, M.key_padding(lengths)), out.detach()) <= 1e-10
    xa = layer.norm1(x) if norm_first else x  # the self-attention's input
    allowed = (~pad)[:, None, None, :].expand(B, H, S, S)
    assert w.shape == (B, H, S, S)
    assert rel_err(w, _weights(layer, xa, allowed).detach()) <= 1e-10


def test_dropout_options():
    layer = TransformerEncoderLayer(E, H, FF, dropout=0.3)
    assert (layer.self_attn.dropout, layer.dropout.p, layer.dropout1.p) == (0.3, 0.3, 0.3)
    layer = TransformerEncoderLayer(
        E, H, FF, dropout=0.1, attention_dropout=0.2, activation_dropout=0.0
    )
    assert (layer.self_attn.dropout, layer.dropout.p, layer.dropout1.p) == (0.2, 0.0, 0.1)


@pytest.mark.parametrize(
    "kw,err,start",
    [
        (dict(attention_dropout=1.5), ValueError, "attention_dropout:"),
        (dict(activation_dropout=-0.1), ValueError, "activation_dropout:"),
        (dict(attention_dropout="0.1"), TypeError, "attention_dropout:"),
    ],
)
def test_bad_dropout_options(kw, err, start):
    with pytest.raises(err, match=f"^{start}"):
        TransformerEncoderLayer(E, H, FF, **kw)


def test_bad_return_weights():
    layer = TransformerEncoderLayer(E, H, FF)
    with pytest.raises(TypeError, match="^return_weights:"):
        layer(torch.randn(B, S, E), return_weights="yes")

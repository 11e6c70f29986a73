"""TransformerLM: equal to the same layers run through torch.nn (float64), causal (no future
token changes an earlier logit), trailing padding changes nothing, cached decoding equals the
full forward, config validation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnkit.models.lm import CausalLayer, LMConfig, TransformerLM
from tests.support.numerics import max_rel_err as rel_err

F64_TOL = 1e-10


def make(seed=0, **kw) -> TransformerLM:
    base = dict(vocab_size=17, d_model=12, nhead=3, num_layers=2, dim_feedforward=20, dropout=0.0)
    base.update(kw)
    torch.manual_seed(seed)
    return TransformerLM(LMConfig(**base)).double().eval()


def tokens(b: int, length: int, seed: int = 1, vocab: int = 17) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (b, length), generator=g)  # no pad/bos/eos


@pytest.mark.parametrize("norm_first", [True, False])
def test_forward_equals_torch_layers(norm_first):
    """Reference: torch.nn.TransformerEncoderLayer with a causal mask, the same weights."""
    torch.manual_seed(3)
    ref_layers = [
        nn.TransformerEncoderLayer(
            12, 3, 20, 0.0, activation="gelu", batch_first=True, norm_first=norm_first
        )
        .double()
        .eval()
        for _ in range(2)
    ]
    lm = make(norm_first=norm_first)
    lm.layers = nn.ModuleList(CausalLayer.from_torch(m) for m in ref_layers)
    lm.eval()
    x = tokens(3, 7)
    pos = torch.arange(7, dtype=torch.float64)[:, None]
    angle = pos / 10000 ** (torch.arange(0, 12, 2, dtype=torch.float64) / 12)
    pe = torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(7, 12)  # sin, cos interleaved
    h = lm.embed(x) * math.sqrt(12) + pe
    causal = torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)  # torch: True = not allowed
    for m in ref_layers:
        h = m(h, src_mask=causal)
    if norm_first:
        h = lm.norm(h)
    want = h @ lm.embed.weight.T + lm.generator.bias
    assert rel_err(lm(x), want) <= F64_TOL


def test_causal_no_future_influence():
    lm = make()
    x = tokens(2, 9)
    y = x.clone()
    y[:, 5:] = tokens(2, 4, seed=7)
    a, b = lm(x), lm(y)
    assert torch.equal(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_trailing_padding_changes_nothing():
    lm = make()
    x = tokens(2, 6)
    padded = torch.cat([x, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    assert rel_err(lm(padded)[:, :6], lm(x)) <= F64_TOL


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("prefix", [1, 4])
def test_cached_decoding_equals_full_forward(norm_first, prefix):
    lm = make(norm_first=norm_first)
    x = tokens(3, 11)
    full = lm(x)
    cache = lm.new_cache()
    parts = [lm.decode_step(x[:, :prefix], cache)]
    parts += [lm.decode_step(x[:, t : t + 1], cache) for t in range(prefix, 11)]
    assert cache.length == 11
    assert rel_err(torch.cat(parts, 1), full) <= F64_TOL


def test_tied_generator():
    lm = make()
    assert lm.generator.weight is lm.embed.weight
    untied = make(tie_embeddings=False)
    assert untied.generator.weight is not untied.embed.weight


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(vocab_size=0), ValueError, "vocab_size"),
        (dict(d_model=10, nhead=3), ValueError, "d_model"),
        (dict(dropout=1.0), ValueError, "dropout"),
        (dict(pad_id=1), ValueError, "pad_id"),
        (dict(bos_id=99), ValueError, "bos_id"),
        (dict(activation="tanh"), ValueError, "activation"),
        (dict(norm_first=1), TypeError, "norm_first"),
    ],
)
def test_config_validation(kw, exc, match):
    base = dict(vocab_size=17, d_model=12, nhead=3)
    base.update(kw)
    with pytest.raises(exc, match=match):
        LMConfig(**base)


def test_bad_tokens():
    lm = make()
    with pytest.raises(TypeError, match="tokens"):
        lm(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"tokens: token ids must lie in \[0, 17\)"):
        lm(torch.tensor([[3, 17]]))
    with pytest.raises(TypeError, match="cache"):
        lm.decode_step(tokens(1, 2), cache=None)

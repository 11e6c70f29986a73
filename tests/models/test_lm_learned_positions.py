"""TransformerLM with learned positions (GPT-2 / nanoGPT): equal to an independent float64
computation (unscaled embeddings + rows of the table, torch.nn layers), packed rows equal each
document run alone (positions restart), cached decoding equals the full forward (causal and
local), gradients reach only the rows used, and a sequence longer than the table is refused
naming the argument before any work."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnkit.models.lm import CausalLayer, LMConfig, TransformerLM
from tests.support.numerics import max_rel_err as rel_err

F64_TOL = 1e-10
TABLE = 12


def make(seed=0, **kw) -> TransformerLM:
    base = dict(vocab_size=17, d_model=12, nhead=3, num_layers=2, dim_feedforward=20)
    base.update(dropout=0.0, positions="learned", max_len=TABLE)
    base.update(kw)
    torch.manual_seed(seed)
    return TransformerLM(LMConfig(**base)).double().eval()


def tokens(b: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 17, (b, length), generator=g)  # no pad/bos/eos


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tie", [True, False])
def test_forward_equals_gpt2_style_reference(bias, tie):
    """Reference: wte[x] + wpe[0..L-1] (no sqrt(d_model)), torch.nn pre-LN layers under a causal
    mask, final LayerNorm, the output layer."""
    torch.manual_seed(3)
    ref_layers = [
        nn.TransformerEncoderLayer(
            12, 3, 20, 0.0, "gelu", batch_first=True, norm_first=True, bias=bias
        )
        .double()
        .eval()
        for _ in range(2)
    ]
    lm = make(bias=bias, tie_embeddings=tie)
    lm.layers = nn.ModuleList(CausalLayer.from_torch(m) for m in ref_layers)
    with torch.no_grad():  # make every table row matter
        lm.positional.weight.normal_(0.0, 1.0)
    lm.eval()
    x = tokens(3, 9)
    h = lm.embed.weight[x] + lm.positional.weight[:9]
    causal = torch.triu(torch.ones(9, 9, dtype=torch.bool), 1)  # torch: True = not allowed
    for m in ref_layers:
        h = m(h, src_mask=causal)
    want = lm.norm(h) @ lm.generator.weight.T
    if bias:
        want = want + lm.generator.bias
    assert rel_err(lm(x), want) <= F64_TOL
    assert lm.positional.weight.shape == (TABLE, 12)
    assert "positional.weight" in lm.state_dict()


def test_initialisation_is_nanogpt_like():
    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(300, d_model=64, nhead=4, num_layers=1, positions="learned"))
    for w in (lm.embed.weight[1:], lm.positional.weight):  # row 0 is the zeroed padding row
        assert abs(float(w.detach().std()) - 0.02) < 0.002


PACKED_LM = make()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.integers(0, 2**16))
def test_packed_rows_equal_each_document_alone(lengths, seed):
    """Documents of random lengths packed into one row of at most the table's length: each
    document's logits equal those of the document run alone from position 0."""
    lm = PACKED_LM
    lengths = lengths[: next(i for i in range(len(lengths), 0, -1) if sum(lengths[:i]) <= TABLE)]
    docs = [tokens(1, n, seed=seed + i) for i, n in enumerate(lengths)]
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    packed = lm(torch.cat(docs, dim=1), doc_ids=ids)
    want = torch.cat([lm(d) for d in docs], dim=1)
    assert rel_err(packed, want) <= F64_TOL


@pytest.mark.parametrize("window", [None, 3])
def test_cached_decoding_equals_full_forward(window):
    lm = make(window=window)
    x = tokens(2, TABLE)
    full = lm(x)
    cache = lm.new_cache()
    parts = [lm.decode_step(x[:, :4], cache)]
    parts += [lm.decode_step(x[:, t : t + 1], cache) for t in range(4, TABLE)]
    assert rel_err(torch.cat(parts, 1), full) <= F64_TOL


def test_gradients_reach_only_the_positions_used():
    lm = make()
    lm(tokens(2, 5)).square().sum().backward()
    g = lm.positional.weight.grad
    assert g[:5].abs().sum(-1).min() > 0 and not g[5:].any()


def test_longer_than_the_table_is_refused_before_any_work():
    lm = make()
    with pytest.raises(ValueError, match=r"tokens: a sequence of 13 tokens .* 12 positions"):
        lm(tokens(1, TABLE + 1))
    with pytest.raises(ValueError, match=r"position_ids: position id 12"):
        lm(tokens(1, 3), position_ids=torch.tensor([[0, 1, 12]]))
    cache = lm.new_cache()
    lm.decode_step(tokens(1, TABLE), cache)
    with pytest.raises(ValueError, match=r"tokens: the cache's 12 tokens and 1 new ones"):
        lm.decode_step(tokens(1, 1), cache)
    assert cache.length == TABLE  # the refused step left the cache alone
    prompt = tokens(1, 4)
    with pytest.raises(ValueError, match=r"max_new_tokens: a prompt of 4 tokens and 10 new"):
        lm.generate(prompt, max_new_tokens=10)
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.beam_search(prompt, beam_size=2, max_new_tokens=10)
    out = lm.generate(prompt, max_new_tokens=9)  # positions 0..11: exactly the table
    assert out.shape[1] <= 9


def test_sinusoidal_positions_extend_beyond_max_len():
    lm = make(positions="sinusoidal")
    assert lm(tokens(1, TABLE + 5)).shape == (1, TABLE + 5, 17)


def test_bad_positions_kind():
    with pytest.raises(ValueError, match="positions: expected one of"):
        LMConfig(17, d_model=12, nhead=3, positions="rope")

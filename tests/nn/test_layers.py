"""SelfAttention, AdditiveAttention and GeneralAttention against the float64 oracle
(attnkit.reference) and against seed 002's own module code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as torch_F
from torch import nn

from attnkit import reference
from attnkit.masks import causal
from attnkit.nn.additive import AdditiveAttention, GeneralAttention
from attnkit.nn.self_attention import SelfAttention
from tests.support.numerics import max_rel_err as rel_err

F64_TOL = 1e-10
F32_TOL = 1e-5


def np64(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def random_mask(*shape: int, seed: int = 0) -> torch.Tensor:
    """Random bool mask (..., Lq, Lk), True = may attend, with at least one key per row."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(shape, generator=g) < 0.6
    m[..., 0] = True
    return m


class SeedSelfAttention(nn.Module):
    """Seed 002's module, copied verbatim (comments translated) as the independent reference.

    Its mask convention: ``masked_fill(mask == 0, -1e9)``, i.e. nonzero = may attend, the same
    as attnkit's True = may attend."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.WQ = nn.Linear(d_model, d_k)  # Q projection
        self.WK = nn.Linear(d_model, d_k)  # K projection
        self.WV = nn.Linear(d_model, d_v)  # V projection
        self.scale = d_k**0.5  # scaling factor sqrt(d_k)

    def forward(self, x, mask=None):
        Q = self.WQ(x)
        K = self.WK(x)
        V = self.WV(x)
        attn_scores = torch.matmul(Q, K.transpose(-2, -1))
        attn_scores = attn_scores / self.scale
        if mask is not None:
            attn_scores = attn_scores.masked_fill(mask == 0, -1e9)
        attn_weights = torch_F.softmax(attn_scores, dim=-1)
        output = torch.matmul(attn_weights, V)
        return output


# --------------------------------------------------------------------------------------------
# SelfAttention
# --------------------------------------------------------------------------------------------
def test_self_attention_seed_run_example():
    sa = SelfAttention(512, 64, 64)
    out = sa(torch.randn(2, 10, 512))
    assert out.shape == (2, 10, 64)


@pytest.mark.parametrize("length", [1, 7, 97])
def test_self_attention_matches_seed_module(length):
    torch.manual_seed(0)
    seed_mod = SeedSelfAttention(13, 5, 3)
    ours = SelfAttention(13, 5, 3)
    ours.load_state_dict(seed_mod.state_dict())  # same parameter names as the seed
    x = torch.randn(2, length, 13)
    assert rel_err(ours(x), seed_mod(x)) <= F32_TOL
    # the seed's 0/1 integer mask (B, L, L), and the same as a bool mask
    m01 = random_mask(2, length, length, seed=length).to(torch.int64)
    want = seed_mod(x, m01)
    assert rel_err(ours(x, m01), want) <= F32_TOL
    assert rel_err(ours(x, m01.bool()), want) <= F32_TOL


@pytest.mark.parametrize("length", [1, 7, 33])
def test_self_attention_matches_reference_float64(length):
    torch.manual_seed(1)
    sa = SelfAttention(11, 7, 5, bias=False).double()
    x = torch.randn(3, length, 11, dtype=torch.float64)
    mask = random_mask(3, length, length, seed=length + 1)
    out, w = sa(x, mask, return_weights=True)
    ref = reference.self_attention(
        np64(x), np64(sa.WQ.weight.T), np64(sa.WK.weight.T), np64(sa.WV.weight.T), mask.numpy()
    )
    assert rel_err(out, ref.output) <= F64_TOL
    assert rel_err(w, ref.weights) <= F64_TOL
    # causal mask object
    out_c = sa(x, causal())
    ref_c = reference.self_attention(
        np64(x),
        np64(sa.WQ.weight.T),
        np64(sa.WK.weight.T),
        np64(sa.WV.weight.T),
        np.tril(np.ones((length, length), dtype=bool)),
    )
    assert rel_err(out_c, ref_c.output) <= F64_TOL
    # float32
    sa32 = SelfAttention(11, 7, 5, bias=False)
    sa32.load_state_dict({k: v.float() for k, v in sa.state_dict().items()})
    assert rel_err(sa32(x.float(), mask), ref.output) <= F32_TOL


def test_self_attention_fully_masked_row_and_grad():
    torch.manual_seed(2)
    sa = SelfAttention(6, 4, 3).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    mask = random_mask(2, 5, 5)
    mask[1, 2] = False  # query 2 of batch 1 may attend to nothing
    out, w = sa(x, mask, return_weights=True)
    assert torch.all(out[1, 2] == 0) and torch.all(w[1, 2] == 0)
    assert torch.isfinite(out).all()
    assert torch.autograd.gradcheck(lambda t: sa(t, mask), (x,), fast_mode=True)


def test_self_attention_bad_input():
    sa = SelfAttention(8, 4, 4)
    with pytest.raises(ValueError, match=r"x: expected shape \(B, L, d_model=8\), got \(2, 3, 5\)"):
        sa(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="mask"):
        sa(torch.randn(2, 3, 8), torch.ones(2, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="d_k"):
        SelfAttention(8, 0, 4)


# --------------------------------------------------------------------------------------------
# AdditiveAttention / GeneralAttention
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lq,lk", [(1, 7), (7, 1), (5, 13)])
def test_additive_matches_reference(lq, lk):
    torch.manual_seed(3)
    att = AdditiveAttention(query_dim=5, key_dim=7, hidden_dim=9, value_dim=3).double()
    q = torch.randn(2, 3, lq, 5, dtype=torch.float64)
    k = torch.randn(2, 3, lk, 7, dtype=torch.float64)
    v = torch.randn(2, 3, lk, 3, dtype=torch.float64)
    mask = random_mask(2, 3, lq, lk, seed=lq * lk)
    ref = reference.additive(
        np64(q), np64(k), np64(v), np64(att.w_q), np64(att.w_k), np64(att.w_v), mask.numpy()
    )
    out, w = att(q, k, v, mask, return_weights=True)
    assert out.shape == (2, 3, lq, 3) and w.shape == (2, 3, lq, lk)
    assert rel_err(out, ref.output) <= F64_TOL
    assert rel_err(w, ref.weights) <= F64_TOL
    att32 = AdditiveAttention(5, 7, 9, 3)
    att32.load_state_dict({n: p.float() for n, p in att.state_dict().items()})
    out32, none = att32(q.float(), k.float(), v.float(), mask)
    assert none is None
    assert rel_err(out32, ref.output) <= F32_TOL


def test_additive_value_defaults_to_key_and_grads():
    torch.manual_seed(4)
    att = AdditiveAttention(4, 6, 5).double()
    q = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)
    out, _ = att(q, k)
    ref = reference.additive(np64(q), np64(k), np64(k), np64(att.w_q), np64(att.w_k), np64(att.w_v))
    assert rel_err(out, ref.output) <= F64_TOL
    out.sum().backward()
    for name, p in att.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert q.grad.abs().sum() > 0 and k.grad.abs().sum() > 0
    small = AdditiveAttention(3, 2, 4).double()
    qs = torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    ks = torch.randn(1, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: small(a, b)[0], (qs, ks))


def test_additive_fully_masked_row():
    att = AdditiveAttention(3, 3, 4)
    q, k = torch.randn(1, 2, 3), torch.randn(1, 4, 3)
    mask = torch.tensor([[True, False, True, True], [False, False, False, False]])
    out, w = att(q, k, mask=mask, return_weights=True)
    assert torch.all(out[0, 1] == 0) and torch.all(w[0, 1] == 0)
    assert torch.isfinite(out).all()


def test_additive_bad_input():
    att = AdditiveAttention(4, 6, 5, value_dim=2)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 7, 6)
    with pytest.raises(ValueError, match=r"query: expected shape .*last dim 4, got \(2, 3, 5\)"):
        att(torch.randn(2, 3, 5), k)
    with pytest.raises(ValueError, match=r"key: expected shape .*last dim 6, got \(2, 7, 5\)"):
        att(q, torch.randn(2, 7, 5))
    with pytest.raises(ValueError, match=r"value: expected shape .*last dim 2, got \(2, 7, 6\)"):
        att(q, k)  # value defaults to key, but value_dim is 2
    with pytest.raises(ValueError, match="hidden_dim"):
        AdditiveAttention(4, 6, 0)


@pytest.mark.parametrize("lq,lk", [(1, 7), (6, 11)])
def test_general_matches_reference(lq, lk):
    torch.manual_seed(5)
    att = GeneralAttention(query_dim=5, key_dim=3).double()
    q = torch.randn(2, lq, 5, dtype=torch.float64)
    k = torch.randn(2, lk, 3, dtype=torch.float64)
    v = torch.randn(2, lk, 4, dtype=torch.float64)
    mask = random_mask(2, lq, lk, seed=7)
    ref = reference.general(np64(q), np64(k), np64(v), np64(att.weight), mask.numpy())
    out, w = att(q, k, v, mask, return_weights=True)
    assert rel_err(out, ref.output) <= F64_TOL
    assert rel_err(w, ref.weights) <= F64_TOL
    att32 = GeneralAttention(5, 3)
    att32.load_state_dict({"weight": att.weight.detach().float()})
    out32, _ = att32(q.float(), k.float(), v.float(), mask)
    assert rel_err(out32, ref.output) <= F32_TOL
    out32.sum().backward()
    assert att32.weight.grad is not None and att32.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"key: expected shape .*last dim 3, got \(2, 11, 4\)"):
        att(q, torch.randn(2, 11, 4, dtype=torch.float64))

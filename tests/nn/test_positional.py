"""Positional encodings against independent computations: a plain-Python loop and
attnkit.reference for the sinusoidal table, complex-number rotations for RoPE, and a float64
scores + bias + softmax for ALiBi."""

from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import reference
from attnkit.masks import causal, key_padding
from attnkit.nn.positional import (
    ALiBi,
    ALiBiMask,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from tests.support.numerics import max_rel_err as rel_err

F64_TOL = 1e-10
F32_TOL = 1e-5


def loop_sinusoid(length: int, d_model: int, offset: int = 0) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))."""
    out = torch.empty(length, d_model, dtype=torch.float64)
    for p in range(length):
        pos = p + offset
        for c in range(d_model):
            i2 = c - (c % 2)
            angle = pos / 10000 ** (i2 / d_model)
            out[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return out


# --------------------------------------------------------------------------------------------
# sinusoidal
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d_model", [1, 7, 16])
def test_sinusoidal_table_matches_loop(d_model):
    got = sinusoidal_table(23, d_model, offset=5, dtype=torch.float64)
    assert rel_err(got, loop_sinusoid(23, d_model, offset=5)) <= F64_TOL


@pytest.mark.parametrize("d_model", [7, 16])
def test_sinusoidal_matches_reference(d_model):
    ref = torch.tensor(reference.sinusoidal_positions(31, d_model).output, dtype=torch.float64)
    pe = SinusoidalPositionalEncoding(d_model, max_len=31)
    x = torch.zeros(1, 31, d_model, dtype=torch.float64)
    assert rel_err(pe(x)[0], ref) <= F64_TOL


def test_sinusoidal_adds_and_extends_beyond_max_len():
    torch.manual_seed(0)
    pe = SinusoidalPositionalEncoding(12, max_len=4)
    x = torch.randn(3, 11, 12, dtype=torch.float64)
    out = pe(x, offset=6)  # positions 6..16, far past max_len
    assert out.shape == x.shape
    assert rel_err(out - x, loop_sinusoid(11, 12, offset=6).expand(3, -1, -1)) <= F64_TOL
    # float32 input: same values to float32 accuracy
    out32 = pe(x.float())
    assert out32.dtype == torch.float32
    assert rel_err(out32, x + loop_sinusoid(11, 12)) <= F32_TOL


def test_sinusoidal_after_double_is_float64_accurate():
    pe = SinusoidalPositionalEncoding(10, max_len=40).double()  # table built in float32
    x = torch.zeros(1, 37, 10, dtype=torch.float64)
    assert rel_err(pe(x)[0], loop_sinusoid(37, 10)) <= F64_TOL


def test_sinusoidal_not_in_state_dict_and_dropout():
    pe = SinusoidalPositionalEncoding(8, max_len=16, dropout=0.5)
    assert "pe" not in pe.state_dict()
    assert len(pe.state_dict()) == 0
    x = torch.zeros(2, 16, 8)
    pe.eval()
    assert torch.equal(pe(x), pe(x))  # no dropout in eval
    pe.train()
    torch.manual_seed(1)
    y = pe(x)
    zeros = (y == 0) & (pe.eval()(x) != 0)
    assert 0 < int(zeros.sum()) < y.numel()


def test_sinusoidal_bad_input():
    pe = SinusoidalPositionalEncoding(8)
    with pytest.raises(ValueError, match=r"x: expected shape .*last dim 8, got \(2, 3, 7\)"):
        pe(torch.zeros(2, 3, 7))
    with pytest.raises(TypeError, match="x: expected a floating-point tensor"):
        pe(torch.zeros(2, 3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="offset"):
        pe(torch.zeros(2, 3, 8), offset=-1)
    with pytest.raises(ValueError, match="d_model"):
        SinusoidalPositionalEncoding(0)


# --------------------------------------------------------------------------------------------
# learned
# --------------------------------------------------------------------------------------------
def test_learned_positional_embedding():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(10, 5)
    x = torch.randn(2, 4, 5)
    out = emb(x, offset=3)
    want = torch.stack(
        [x[b] + torch.stack([emb.weight[3 + i] for i in range(4)]) for b in range(2)]
    )
    assert rel_err(out, want) <= F32_TOL
    out.sum().backward()
    g = emb.weight.grad
    assert torch.all(g[3:7] == 2) and torch.all(g[:3] == 0) and torch.all(g[7:] == 0)
    assert emb(torch.randn(1, 10, 5)).shape == (1, 10, 5)
    with pytest.raises(ValueError, match=r"positions 8\.\.11 .*exceed max_len=10"):
        emb(torch.randn(1, 4, 5), offset=8)
    with pytest.raises(ValueError, match="exceed max_len=10"):
        emb(torch.randn(1, 11, 5))
    with pytest.raises(ValueError, match=r"x: expected shape .*last dim 5"):
        emb(torch.randn(1, 3, 4))


# --------------------------------------------------------------------------------------------
# rotary
# --------------------------------------------------------------------------------------------
def complex_rope(x: torch.Tensor, offset: int, base: float) -> torch.Tensor:
    """Rotate pairs (x[c], x[c + d/2]) as complex numbers z * exp(i * pos * base^(-2c/d))."""
    d = x.shape[-1]
    half = d // 2
    flat = x.reshape(-1, x.shape[-2], d)
    out = torch.empty_like(flat)
    for n in range(flat.shape[0]):
        for r in range(flat.shape[1]):
            pos = offset + r
            for c in range(half):
                z = complex(float(flat[n, r, c]), float(flat[n, r, c + half]))
                z = z * cmath.exp(1j * pos * base ** (-2.0 * c / d))
                out[n, r, c], out[n, r, c + half] = z.real, z.imag
    return out.reshape(x.shape)


def test_rope_matches_complex_rotation():
    torch.manual_seed(0)
    rope = RotaryEmbedding(6, base=500.0)
    q = torch.randn(2, 3, 7, 6, dtype=torch.float64)
    k = torch.randn(2, 3, 5, 6, dtype=torch.float64)
    rq, rk = rope(q, k, q_offset=4, k_offset=1)
    assert rel_err(rq, complex_rope(q, 4, 500.0)) <= F64_TOL
    assert rel_err(rk, complex_rope(k, 1, 500.0)) <= F64_TOL
    rq32, _ = rope(q.float(), k.float(), q_offset=4)
    assert rq32.dtype == torch.float32
    assert rel_err(rq32, complex_rope(q, 4, 500.0)) <= F32_TOL


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(1)
    rope = RotaryEmbedding(16)
    q = torch.randn(1, 2, 7, 16, dtype=torch.float64)
    k = torch.randn(1, 2, 9, 16, dtype=torch.float64)

    def scores(qo, ko):
        rq, rk = rope(q, k, q_offset=qo, k_offset=ko)
        return rq @ rk.transpose(-2, -1)

    s0 = scores(0, 3)
    for shift in (1, 17, 1000):
        assert rel_err(scores(shift, 3 + shift), s0) <= 1e-9  # angles up to ~1e3 rad
    # and they do depend on the relative position
    assert rel_err(scores(0, 4), s0) > 1e-3
    # a rotation keeps norms
    rq, _ = rope(q, k)
    assert rel_err(rq.norm(dim=-1), q.norm(dim=-1)) <= F64_TOL


def test_rope_bad_input():
    with pytest.raises(ValueError, match="head_dim: expected an even int, got 7"):
        RotaryEmbedding(7)
    rope = RotaryEmbedding(8)
    with pytest.raises(ValueError, match=r"k: expected shape .*last dim 8, got \(1, 2, 3, 6\)"):
        rope(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 6))
    with pytest.raises(ValueError, match="q_offset"):
        rope(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8), q_offset=-2)


BAD_POSITIONAL = [
    (lambda: RotaryEmbedding(4).cos_sin(-3), ValueError, "length"),
    (lambda: RotaryEmbedding(4).cos_sin(2.5), TypeError, "length"),
    (lambda: RotaryEmbedding(4).cos_sin(3, True), TypeError, "offset"),
    (lambda: RotaryEmbedding(4).cos_sin(3, dtype=3), TypeError, "dtype"),
    (lambda: RotaryEmbedding(4).cos_sin(3, dtype=torch.int32), ValueError, "dtype"),
    (lambda: RotaryEmbedding(4).cos_sin(3, device="nope"), ValueError, "device"),
    (lambda: RotaryEmbedding(True), TypeError, "head_dim"),
    (lambda: RotaryEmbedding(4, base="10"), TypeError, "base"),
    (lambda: RotaryEmbedding(4, base=1.0), ValueError, "base"),
    (lambda: RotaryEmbedding(4).rotate(torch.zeros(2, 4), offset=-1), ValueError, "offset"),
    (lambda: sinusoidal_table(-1, 4), ValueError, "length"),
    (lambda: sinusoidal_table(3, 4, dtype=torch.long), ValueError, "dtype"),
    (lambda: sinusoidal_table(3, 4, device="nope"), ValueError, "device"),
    (lambda: SinusoidalPositionalEncoding(8, dropout=1.5), ValueError, "dropout"),
    (lambda: SinusoidalPositionalEncoding(8, max_len=True), TypeError, "max_len"),
    (lambda: SinusoidalPositionalEncoding(8).table(-2), ValueError, "length"),
    (lambda: LearnedPositionalEmbedding(0, 4), ValueError, "max_len"),
    (lambda: LearnedPositionalEmbedding(4, 2)(torch.zeros(1, 3, 2).double()), TypeError, "x"),
    (
        lambda: LearnedPositionalEmbedding(4, 2)(torch.zeros(1, 3, 2), offset=1.0),
        TypeError,
        "offset",
    ),
    (lambda: ALiBi(True), TypeError, "num_heads"),
]


@pytest.mark.parametrize(
    "make,exc,name", BAD_POSITIONAL, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD_POSITIONAL)]
)
def test_positional_arguments_are_checked_before_torch(make, exc, name):
    with pytest.raises(exc) as info:
        make()
    assert str(info.value).startswith(name), str(info.value)


def test_cos_sin_against_float64_angles():
    cos, sin = RotaryEmbedding(6, base=100.0).cos_sin(5, 3, dtype=torch.float64)
    pos = np.arange(3, 8)[:, None]
    ang = pos * 100.0 ** (-np.arange(3) * 2.0 / 6)
    np.testing.assert_allclose(cos.numpy(), np.cos(np.concatenate([ang, ang], 1)), rtol=1e-14)
    np.testing.assert_allclose(sin.numpy(), np.sin(np.concatenate([ang, ang], 1)), rtol=1e-14)
    assert RotaryEmbedding(4).cos_sin(0)[0].shape == (0, 4)


# --------------------------------------------------------------------------------------------
# ALiBi
# --------------------------------------------------------------------------------------------
PAPER_SLOPES = {
    8: [2.0 ** -(h + 1) for h in range(8)],
    # non power of two: the 4 slopes of H=4, then every other slope of H=8
    6: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3],
}


def alibi_attention_loop(q, k, v, slopes, causal_mask=False, lengths=None):
    """float64 softmax(q kᵀ / sqrt(d) - slope_h |i - (j - (Lk - Lq))|) v, written out."""
    b_, h_, lq, d = q.shape
    lk = k.shape[-2]
    out = torch.zeros(b_, h_, lq, v.shape[-1], dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            for i in range(lq):
                s = []
                for j in range(lk):
                    dist = abs(j - (i + lk - lq))
                    ok = not (causal_mask and j > i + lk - lq)
                    ok = ok and (lengths is None or j < lengths[b])
                    sc = float(q[b, h, i] @ k[b, h, j]) / math.sqrt(d) - slopes[h] * dist
                    s.append(sc if ok else -math.inf)
                m = max(s)
                e = [math.exp(x - m) for x in s]
                z = sum(e)
                for j in range(lk):
                    out[b, h, i] += e[j] / z * v[b, h, j]
    return out


@pytest.mark.parametrize("heads", [8, 6])
def test_alibi_slopes_are_the_papers(heads):
    got = ALiBi(heads).slopes
    assert torch.equal(got, torch.tensor(PAPER_SLOPES[heads], dtype=torch.float64))


@pytest.mark.parametrize("lq,lk", [(5, 5), (3, 7), (1, 4)])
def test_alibi_attention_matches_loop(lq, lk):
    torch.manual_seed(2)
    heads = 6
    q = torch.randn(2, heads, lq, 4, dtype=torch.float64)
    k = torch.randn(2, heads, lk, 4, dtype=torch.float64)
    v = torch.randn(2, heads, lk, 3, dtype=torch.float64)
    mask = ALiBi(heads).mask()
    assert isinstance(mask, ALiBiMask) and mask.batch_shape == (1, heads)
    assert bool(mask.materialize(lq, lk).all())
    want = alibi_attention_loop(q, k, v, PAPER_SLOPES[heads])
    out = F.scaled_dot_product_attention(q, k, v, mask)
    assert rel_err(out, want) <= F64_TOL
    out32 = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), ALiBi(heads)())
    assert rel_err(out32, want) <= F32_TOL
    # combined with a causal mask and key padding (bias adds, allowed sets intersect)
    lengths = [lk, max(1, lk - 2)]
    m2 = ALiBi(heads)() & causal("bottom_right") & key_padding(lengths)
    want2 = alibi_attention_loop(q, k, v, PAPER_SLOPES[heads], True, lengths)
    assert rel_err(F.scaled_dot_product_attention(q, k, v, m2), want2) <= F64_TOL


def test_alibi_bias_values():
    bias = ALiBi(8)().materialize_bias(3, 5)
    assert bias.shape == (1, 8, 3, 5)
    for h in range(8):
        for i in range(3):
            for j in range(5):
                assert bias[0, h, i, j] == -PAPER_SLOPES[8][h] * abs(j - (i + 2))


def test_alibi_bad_input():
    with pytest.raises(ValueError, match="num_heads"):
        ALiBi(0)
    with pytest.raises(ValueError, match="slopes"):
        ALiBiMask(torch.ones(2, 2))
    from attnkit import masks

    assert ALiBiMask is masks.ALiBi  # one implementation of ALiBi
    # heads of the mask must line up with dim 1 of the inputs
    q = torch.randn(1, 4, 3, 2)
    with pytest.raises(ValueError, match="mask: its batch shape"):
        F.scaled_dot_product_attention(q, q, q, ALiBi(8)())


# --------------------------------------------------------------------------------------------
# inside MultiHeadAttention, with a KV cache
# --------------------------------------------------------------------------------------------
def _heads(mha, x):
    """Project x (B, L, E) with mha's q/k/v projections and split heads: 3 x (B, H, L, d)."""
    b, length, _ = x.shape
    h, d = mha.num_heads, mha.head_dim

    def split(t):
        return t.reshape(b, length, h, d).transpose(1, 2)

    ws, bs = mha.in_proj.weights(), mha.in_proj.biases()
    return tuple(split(x @ w.T + b) for w, b in zip(ws, bs, strict=True))


def _merge(mha, o):
    b, h, length, d = o.shape
    return o.transpose(1, 2).reshape(b, length, h * d) @ mha.out_proj.weight.T + mha.out_proj.bias


def test_rotary_in_multihead_attention_with_cache():
    from attnkit.nn.attention import MultiHeadAttention

    torch.manual_seed(3)
    mha = MultiHeadAttention(12, 3, rotary=RotaryEmbedding(4)).double().eval()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    full, _ = mha(x, mask=causal())
    q, k, v = (t.detach() for t in _heads(mha, x))
    ref = reference.scaled_dot_product(
        complex_rope(q, 0, 10000.0).numpy(),
        complex_rope(k, 0, 10000.0).numpy(),
        v.numpy(),
        np.tril(np.ones((7, 7), dtype=bool)),
    )
    want = _merge(mha, torch.tensor(np.array(ref.output)))
    assert rel_err(full, want) <= F64_TOL
    cache = mha.new_cache()
    steps = torch.cat([mha(x[:, t : t + 1], cache=cache)[0] for t in range(7)], dim=1)
    assert rel_err(steps, full) <= F64_TOL


def test_alibi_in_multihead_attention_with_cache():
    from attnkit.nn.attention import MultiHeadAttention

    torch.manual_seed(4)
    mha = MultiHeadAttention(12, 6).double().eval()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    alibi = ALiBi(6)
    full, _ = mha(x, mask=alibi() & causal())
    q, k, v = (t.detach() for t in _heads(mha, x))
    want = _merge(mha, alibi_attention_loop(q, k, v, PAPER_SLOPES[6], causal_mask=True))
    assert rel_err(full, want) <= F64_TOL
    cache = mha.new_cache()
    # one new query against all cached keys: the bottom-right aligned bias is -slope * (t - j)
    steps = torch.cat([mha(x[:, t : t + 1], mask=alibi(), cache=cache)[0] for t in range(5)], 1)
    assert rel_err(steps, full) <= F64_TOL

"""The NaN/inf/overflow policy P1-P6 (README "Conventions"; :mod:`attnkit.kernels.policy.numerics`)
and the gradient of learned biases, for every dot backend (math, dense, blocksparse) and dtype.

References are float64: :mod:`attnkit.reference` (NumPy) for outputs, torch.autograd on a plain
float64 implementation written here for gradients. Tolerances: float64 1e-10, float32 1e-5
relative; float16/bfloat16 4x the dtype's epsilon (P4: they compute in float32 and round once,
so the rounding of the result dominates).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import kernels, reference
from attnkit import masks as M
from attnkit.kernels import blocksparse as bs
from attnkit.kernels import dispatch
from tests.support.numerics import rel_err

BACKENDS = ("math", "dense", "blocksparse")
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
L, D = 40, 8


def tol(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 4 * torch.finfo(dtype).eps)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """blocksparse with 8 x 8 blocks, accepting any sparsity (all its plans run at L = 40)."""
    monkeypatch.setitem(kernels.BACKENDS, "blocksparse", bs.BlocksparseBackend(8, 8, 0.0))
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def qkv(seed: int, dtype: torch.dtype, scale_qk: float = 1.0, lq: int = L, lk: int = L):
    """q, k, v (2, 2, L, D) drawn in float64, q and k scaled, then rounded to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((2, 2, lq, D), generator=g, dtype=torch.float64) * scale_qk
    k = torch.randn((2, 2, lk, D), generator=g, dtype=torch.float64) * scale_qk
    v = torch.randn((2, 2, lk, D), generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def ref_out(q, k, v, allowed: np.ndarray | None, bias: np.ndarray | None = None) -> np.ndarray:
    """The float64 reference output on the (rounded) inputs."""
    m = allowed
    if bias is not None:
        m = np.where(allowed, bias, -np.inf)
    f = [t.detach().double().numpy() for t in (q, k, v)]
    return reference.scaled_dot_product(*f, mask=m).output


def attend(q, k, v, mask, backend):
    return F.scaled_dot_product_attention(q, k, v, mask, backend=backend)


# ---------------------------------------------------------------------------------------------
# P1: rows without keys
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_p1_rows_without_keys_give_zero_output_and_gradient(backend, dtype):
    q, k, v = (t.requires_grad_() for t in qkv(1, dtype))
    mask = M.key_padding([0, 30]) & M.sliding_window(3, 3)
    out = attend(q, k, v, mask, backend)
    allowed = mask.materialize(L, L)[:, None].numpy()  # (2, 1, L, L)
    assert rel_err(out, ref_out(q, k, v, allowed)) <= tol(dtype)
    empty = torch.from_numpy(~allowed.any(-1)).expand(2, 2, L)  # batch 0, rows 34.. of batch 1
    assert (out[empty] == 0).all()
    out.backward(torch.ones_like(out))
    assert (q.grad[empty] == 0).all() and (k.grad[0] == 0).all() and (v.grad[0] == 0).all()


# ---------------------------------------------------------------------------------------------
# P2, P3, P5: finite values are values; overflow goes to float64
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-1e30, -torch.finfo(torch.float32).max, -1e300])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_p2_a_huge_negative_bias_is_a_bias_not_a_mask(backend, dtype, value):
    """Rows whose every allowed key has the same huge negative bias attend uniformly (the
    float64 result), never as an empty row."""
    q, k, v = qkv(2, dtype)
    allowed = M.sliding_window(4).materialize(L, L).numpy()
    bias = np.zeros((L, L))
    bias[::3] = value  # every third row: all keys biased
    bias[1, :20] = value  # part of a row: those keys get weight ~0, the others share it
    mask = M.sliding_window(4) & M.from_tensor(torch.from_numpy(bias))
    out = attend(q, k, v, mask, backend)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref_out(q, k, v, allowed, bias)) <= tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_p3_extreme_but_finite_scores(backend, dtype):
    """Scores near 1e30 (1e300 in float64, 1e5 in float16: beyond float16's range, inside
    float32's) give the float64 result: the softmax subtracts the row max."""
    s = {torch.float64: 1e150, torch.float16: 200.0}.get(dtype, 1e15)
    q, k, v = qkv(3, dtype, scale_qk=s)
    mask = M.sliding_window(5) & M.causal()
    out = attend(q, k, v, mask, backend)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref_out(q, k, v, mask.materialize(L, L).numpy())) <= tol(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_p5_scores_that_overflow_the_compute_dtype(backend, dtype):
    """q, k near 1e20: q.k near 1e40 overflows float32; the call runs in float64."""
    q, k, v = qkv(4, dtype, scale_qk=1e20)
    mask = M.sliding_window(5)
    out = attend(q, k, v, mask, backend)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref_out(q, k, v, mask.materialize(L, L).numpy())) <= tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_p5_alibi_with_a_huge_slope(backend, dtype):
    """alibi(1e300): biases far beyond float32 saturate or run in float64, never -inf."""
    q, k, v = qkv(5, dtype)
    mask = M.alibi(1e300) & M.sliding_window(6)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    bias = -1e300 * np.abs(j - i).astype(np.float64)
    out = attend(q, k, v, mask, backend)
    want = ref_out(q, k, v, M.sliding_window(6).materialize(L, L).numpy(), bias)
    assert torch.isfinite(out).all()
    assert rel_err(out, want) <= tol(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_p5_gradients_with_huge_scores(backend, dtype):
    """Scores near 1e7 are exact in float32 forward, but a fused backward recomputing
    exp(s - logsumexp) would be off by factors of e: such calls need float64 (P5's second
    bound). Rows with a single key (true gradient of q: 0) included."""
    q, k, v = (t.requires_grad_() for t in qkv(9, dtype))
    with torch.no_grad():
        q.mul_(1e6)
    mask = M.causal() & M.sliding_window(2)
    out = attend(q, k, v, mask, backend)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(d_out)
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    allowed = mask.materialize(L, L)
    ref = _f64_attention(*x64, allowed, torch.zeros((), dtype=torch.float64))
    ref.backward(d_out.double())
    assert rel_err(out, ref.detach().numpy()) <= tol(dtype)
    for name, t, r in zip("qkv", (q, k, v), x64, strict=True):
        assert torch.isfinite(t.grad).all(), name
        want = r.grad.numpy()
        err = rel_err(t.grad, want)
        assert err <= tol(dtype), f"gradient of {name}: rel err {err:.3g}"


# ---------------------------------------------------------------------------------------------
# P6: non-finite inputs
# ---------------------------------------------------------------------------------------------
P6_CASES = [
    # (what, value, position, rows that attend to it): window of 3 on both sides, L = 40
    ("k", math.nan, 20, range(17, 24)),
    ("k", math.inf, 20, range(17, 24)),
    ("k", -math.inf, 20, range(17, 24)),
    ("v", math.nan, 0, range(0, 4)),
    ("v", math.inf, 39, range(36, 40)),
    ("q", math.nan, 10, range(10, 11)),
    ("q", -math.inf, 10, range(10, 11)),
]
BIAS_CASES = [  # (value, position): attended by row 10, and outside the window (by no row)
    (math.nan, (10, 12)),
    (math.inf, (10, 12)),
    (math.nan, (10, 30)),
]


@pytest.mark.parametrize("value,pos", BIAS_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_p6_float_mask_holding_nan_or_inf_is_refused(backend, dtype, value, pos):
    """A float mask (bias) with NaN or +inf anywhere, attended or not: a ValueError naming the
    mask, before any output (-inf stays "not allowed")."""
    q, k, v = qkv(6, dtype)
    bias = torch.zeros((L, L), dtype=torch.float64)
    bias[5, 6] = -math.inf
    bias[pos] = value
    with pytest.raises(ValueError, match=r"^mask: .*NaN or \+inf"):
        attend(q, k, v, M.sliding_window(3) & M.from_tensor(bias), backend)


@pytest.mark.parametrize("what,value,pos,rows", P6_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_p6_nonfinite_values_poison_exactly_the_rows_that_attend_to_them(
    backend, dtype, what, value, pos, rows
):
    q, k, v = qkv(6, dtype)
    bias = torch.zeros((L, L), dtype=torch.float64)
    bias[5, 6] = -math.inf  # P2: -inf is "not allowed", not a non-finite value
    clean = {"q": q.clone(), "k": k.clone(), "v": v.clone(), "bias": bias.clone()}
    x = {"q": q, "k": k, "v": v}[what]
    x[1, 0, pos, 2] = value  # batch element 1, head 0
    mask = M.sliding_window(3) & M.from_tensor(bias)
    out = attend(q, k, v, mask, backend)
    allowed = (M.sliding_window(3) & M.from_tensor(clean["bias"])).materialize(L, L).numpy()
    want = ref_out(clean["q"], clean["k"], clean["v"], allowed, clean["bias"].numpy())
    bad = torch.zeros((2, 2, L), dtype=torch.bool)
    for r in rows:
        bad[1, 0, r] = True
    assert torch.isnan(out[bad]).all(), f"rows attending to {what}={value} must be NaN"
    got = out.detach().double()[~bad]
    assert torch.isfinite(got).all(), "a row that does not attend to it stays finite"
    assert rel_err(got, torch.from_numpy(want.copy())[~bad]) <= tol(dtype)


# ---------------------------------------------------------------------------------------------
# gradients of learned biases (float masks that require grad)
# ---------------------------------------------------------------------------------------------
def _f64_attention(q, k, v, allowed: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A plain float64 implementation, differentiable in bias (the gradient reference)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias
    s = s.masked_fill(~allowed, -math.inf)
    w = torch.softmax(s, -1).nan_to_num(0.0)  # rows without keys: 0
    return w @ v


def _bias_cases(lq: int, lk: int, g: torch.Generator):
    """(name, bias leaf (float64), mask built from it, allowed (..., Lq, Lk) for the reference,
    bias broadcast for the reference)."""
    out = []
    b = torch.randn((lq, lk), generator=g, dtype=torch.float64)
    b[3] = -math.inf  # a row without keys
    out.append(("causal&bias", b, lambda t: M.causal("bottom_right") & M.from_tensor(t)))
    b = torch.randn((1, 2, lq, lk), generator=g, dtype=torch.float64)  # per head
    out.append(("window&per_head_bias", b, lambda t: M.sliding_window(4) & M.from_tensor(t)))
    b = torch.randn((2, lq, lk), generator=g, dtype=torch.float64)  # per batch element
    out.append(("window&batched_bias", b, lambda t: M.sliding_window(2, 5) & M.from_tensor(t)))
    b = torch.randn((2, lk), generator=g, dtype=torch.float64)
    b[0] = -math.inf  # batch element 0: no key at all
    b[1, : lk // 2] = -math.inf
    out.append(("float_key_padding", b, lambda t: M.from_key_padding_mask(t)))
    return out


def _reference_bias_grad(name, b, build, q, k, v, d_out):
    """The bias gradient from torch.autograd on the float64 implementation."""
    b64 = b.detach().clone().requires_grad_()
    mask = build(b64)
    lq, lk = q.shape[-2], k.shape[-2]
    allowed = mask.materialize(lq, lk)
    bias = mask.materialize_bias(lq, lk, torch.float64)
    nb = len(mask.batch_shape)
    lift = (lambda t: t.reshape(t.shape[:nb] + (1,) * (2 - nb) + t.shape[-2:])) if nb else None
    if lift:
        allowed, bias = lift(allowed), lift(bias)
    out = _f64_attention(*(t.detach().double() for t in (q, k, v)), allowed, bias)
    out.backward(d_out.double())
    return out.detach(), b64.grad


@pytest.mark.parametrize("lq,lk", [(L, L), (24, L)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS + ("auto",))
def test_bias_gradient_in_every_backend(backend, dtype, lq, lk):
    g = torch.Generator().manual_seed(8)
    q, k, v = qkv(8, dtype, lq=lq, lk=lk)
    d_out = torch.randn((2, 2, lq, D), generator=g, dtype=torch.float64).to(dtype)
    for name, b, build in _bias_cases(lq, lk, g):
        leaf = b.to(dtype).requires_grad_()
        want_out, want_grad = _reference_bias_grad(name, leaf.double(), build, q, k, v, d_out)
        out = attend(q, k, v, build(leaf), backend)
        assert out.grad_fn is not None, f"{name}: output not linked to the bias"
        out.backward(d_out)
        assert leaf.grad is not None, f"{name}: bias gradient dropped"
        t = tol(dtype) if dtype != torch.bfloat16 else 2e-2
        assert rel_err(out, want_out.numpy()) <= t, name
        assert rel_err(leaf.grad, want_grad.numpy()) <= t, f"{name}: bias gradient"


@pytest.mark.parametrize("backend", ("auto",) + BACKENDS)
def test_float64_scores_beyond_float64_are_refused(backend):
    """Finite float64 q, k whose scores overflow float64 (|q.k| ~ 4e320): a row whose allowed
    scores all overflowed to -inf was read as a row without keys and got output 0 (the answer
    is the value of key 0, the largest score), a row of +inf got NaN. Refused before the
    kernel runs, naming q and k; scores just inside the range still run."""
    q = torch.full((1, 1, 2, 4), 1e160, dtype=torch.float64)
    q[0, 0, 1] = 1.0
    k = -torch.full((1, 1, 3, 4), 1e160, dtype=torch.float64)
    k = k * torch.tensor([1.0, 1.0001, 2.0], dtype=torch.float64)[:, None]
    v = torch.arange(1.0, 4.0, dtype=torch.float64).view(1, 1, 3, 1)
    with pytest.raises(ValueError, match=r"q, k: .*float64"):
        F.scaled_dot_product_attention(q, k, v, M.causal("bottom_right"), backend=backend)
    out = F.scaled_dot_product_attention(
        q * 1e-20, k * 1e-20, v, M.causal("bottom_right"), backend=backend
    )
    np.testing.assert_allclose(out.flatten().numpy(), [1.0, 1.0], atol=1e-12)

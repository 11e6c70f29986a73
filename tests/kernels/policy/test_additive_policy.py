"""The NaN/inf/overflow policy (P1-P6, README "Conventions") for both additive backends.

- P1: a row without an allowed key gives 0 and gradient 0, whatever its inputs hold.
- P2/P3: no score is a sentinel: scores of -1e30 (or +-1e30, or all equal and hugely negative)
  give the float64 reference's softmax; float biases of -1e30 / -finfo.max are real biases.
- P5: finite inputs whose scores or projections could overflow float32 are computed in float64
  and rounded, so the output stays finite and equal to the reference.
- P6: NaN or +-inf in q_i, in k_j or v_j of a key row i may attend to, or in any weight
  (w_q, w_k, w_v: they enter every score) makes row i NaN; rows that do not read the value are
  unaffected and equal the float64 reference. (The additive score passes q and k through tanh,
  which would saturate an infinite projection to +-1; an infinite input is treated as corrupt,
  like NaN, in every backend.)

Tolerance: float32, relative error <= 1e-5 against :func:`attnkit.reference.additive` on the
rows that must be finite.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels import BACKENDS
from attnkit.kernels import additive as AF
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.policy.additive import input_stats
from tests.support import grads as G
from tests.support.numerics import rel_err

TOL = 1e-5
FUSED = BACKENDS["additive_fused"]
BACKEND_NAMES = [
    pytest.param(
        "additive_fused",
        marks=pytest.mark.skipif(FUSED.available() is not None, reason=str(FUSED.available())),
    ),
    "math",
]
BIG = float(torch.finfo(torch.float32).max)


def make(lq=9, lk=11, h=6, seed=0, batch=(2,)):
    """float64 leaves q (batch, Lq, 4), k (batch, Lk, 5), v (batch, Lk, 3), w_q, w_k, w_v."""
    g = torch.Generator().manual_seed(seed)
    shapes = (batch + (lq, 4), batch + (lk, 5), batch + (lk, 3), (h, 4), (h, 5), (h,))
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def reference(xs, mask=None, lq=None, lk=None):
    q = xs[0]
    m = None
    if mask is not None:
        allowed = mask.materialize(q.shape[-2], xs[1].shape[-2]).numpy()
        m = allowed.reshape(
            allowed.shape[:-2] + (1,) * (q.dim() - allowed.ndim) + allowed.shape[-2:]
        )
    return R.additive(*(x.numpy() for x in xs), mask=m)


def run(xs, backend, mask=None, grad=False):
    x32 = [x.float().requires_grad_(grad) for x in xs]
    return F.additive_attention(*x32, mask, backend=backend), x32


# ---------------------------------------------------------------------------------------------
# P2 / P3: extreme but finite scores are scores
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_hugely_negative_scores_are_not_masked(backend):
    """Every score about -1e30 * h (tanh saturated at -1, w_v = 1e30): the softmax is uniform
    over the allowed keys, not an empty row (the old kernel returned zeros)."""
    xs = make()
    xs[0] = xs[0] * 1e3 - 1e4  # qp far below -1: tanh = -1 for every key
    xs[3] = xs[3].abs() + 0.5  # W_q > 0, so qp << 0 in every hidden unit
    xs[5] = torch.full_like(xs[5], 1e30)
    ref = reference(xs)
    assert (ref.scores < -1e30).all()
    out, x32 = run(xs, backend, grad=True)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref.output) <= TOL
    d_out = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out.backward(d_out.float())
    want = G.additive(ref, *(x.numpy() for x in xs[3:]), d_out.numpy())
    assert rel_err(x32[2].grad, want["v"]) <= TOL
    for x in x32:
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("scale", [1e30, -1e30, 1e20, 1e6])
def test_extreme_score_scales(backend, scale):
    """w_v of +-1e30 (scores of +-1e30 with gaps of the same size), and smaller extremes; with
    a causal mask so that some rows have a single key. Output and gradients of v and q."""
    xs = make(lq=13, lk=13, seed=2)
    xs[5] = xs[5] * scale
    mask = M.causal()
    ref = reference(xs, mask)
    out, x32 = run(xs, backend, mask, grad=True)
    assert torch.isfinite(out).all() and rel_err(out, ref.output) <= TOL
    d_out = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out.backward(d_out.float())
    want = G.additive(ref, *(x.numpy() for x in xs[3:]), d_out.numpy())
    assert rel_err(x32[2].grad, want["v"]) <= TOL


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_huge_inputs_saturate_tanh(backend):
    """q of 1e30: W_q q ~ 1e30, tanh = +-1 exactly (the direct tanh path of the fused kernel)."""
    xs = make(seed=3)
    xs[0] = xs[0] * 1e30
    ref = reference(xs)
    out, _ = run(xs, backend)
    assert torch.isfinite(out).all() and rel_err(out, ref.output) <= TOL


@pytest.mark.parametrize("bias", [-1e30, -BIG, -1e300])
def test_hugely_negative_biases_are_biases(bias):
    """A float mask of -1e30 / -finfo.max (and -1e300 in float64, saturating in float32) is a
    real bias: with the same bias on every key of a row it cancels in the softmax. The fused
    kernel takes no bias, so auto routes to math; forcing the fused kernel is refused."""
    xs = make(lq=5, lk=7, seed=4)
    t = torch.zeros((5, 7), dtype=torch.float64)
    t[1] = bias  # row 1: every key shifted by the same amount
    t[2, :3] = bias  # row 2: keys 0-2 shifted: they get (almost) no weight, but stay allowed
    t[3, :] = -math.inf  # row 3: masked
    x32 = [x.float() for x in xs]
    ref = R.additive(*(x.numpy() for x in xs), mask=t.numpy())
    mask = t if bias == -1e300 else t.float()  # a float64 mask: saturates at -finfo.max (P5)
    out = F.additive_attention(*x32, mask)
    assert (
        F.explain_dispatch(
            *x32[:3], mask, kind="additive", w_q=x32[3], w_k=x32[4], w_v=x32[5]
        ).chosen
        == "math"
    )
    assert torch.isfinite(out).all()
    assert rel_err(out, ref.output) <= TOL
    assert (out[:, 3] == 0).all()
    with pytest.raises(ValueError, match="bias"):
        F.additive_attention(*x32, mask, backend="additive_fused")


def test_learned_bias_gradient_is_routed_and_computed():
    """A float mask that requires grad, combined with a structured mask: additive_fused declares
    it cannot serve it (no bias), auto picks math, and the bias gets its float64 gradient."""
    xs = make(lq=9, lk=11, seed=5)
    bias = torch.randn((9, 11), dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    b32 = bias.float().requires_grad_()
    mask = M.causal("bottom_right") & M.from_tensor(b32)
    x32 = [x.float().requires_grad_() for x in xs]
    d = F.explain_dispatch(*x32[:3], mask, kind="additive", w_q=x32[3], w_k=x32[4], w_v=x32[5])
    assert d.chosen == "math" and any("bias" in r for r in d.reasons["additive_fused"])
    out = F.additive_attention(*x32, mask)
    allowed = M.causal("bottom_right").materialize(9, 11).numpy()
    ref = R.additive(*(x.numpy() for x in xs), mask=np.where(allowed, bias.numpy(), -np.inf))
    assert rel_err(out, ref.output) <= TOL
    d_out = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    out.backward(d_out.float())
    want = G.additive(ref, *(x.numpy() for x in xs[3:]), d_out.numpy())
    assert b32.grad is not None
    assert rel_err(b32.grad, want["bias"].sum(0)) <= TOL


# ---------------------------------------------------------------------------------------------
# P5: overflow
# ---------------------------------------------------------------------------------------------
def risk(x32) -> bool:
    """The policy's P5 test for float32 inputs q, k, v, w_q, w_k, w_v."""
    call = AttentionCall("additive", *x32[:3], w_q=x32[3], w_k=x32[4], w_v=x32[5])
    return AF.overflow_risk(call, torch.float32, input_stats(call))


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("case", ["scores", "projection"])
def test_overflowing_float32_is_computed_in_float64(backend, case):
    """sum |w_v| near finfo.max (scores that overflow float32), or W_q q beyond finfo.max:
    finite, and equal to the float64 reference rounded to float32."""
    xs = make(seed=8)
    if case == "scores":
        xs[5] = torch.full_like(xs[5], BIG / 4) * torch.sign(xs[5])
    else:
        xs[0], xs[3] = xs[0] * 1e20, xs[3] * 1e20  # qp ~ 1e40 > float32 max
    x32 = [x.float() for x in xs]
    assert all(torch.isfinite(x).all() for x in x32)
    assert risk(x32)
    ref = reference(xs)
    out, _ = run(xs, backend)
    assert torch.isfinite(out).all() and rel_err(out, ref.output) <= TOL


def test_ordinary_inputs_stay_in_float32():
    x32 = [x.float() for x in make(seed=9)]
    assert not risk(x32)


# ---------------------------------------------------------------------------------------------
# P1 / P6: non-finite inputs
# ---------------------------------------------------------------------------------------------
def _expected_nan_rows(allowed: np.ndarray, bad_rows: np.ndarray, bad_keys: np.ndarray):
    """(batch, Lq) bool: rows that have an allowed key and read a bad row or key."""
    has_key = allowed.any(-1)
    return has_key & (bad_rows | (allowed & bad_keys[..., None, :]).any(-1))


CORRUPT = {
    # name -> (tensor index, index into it, value)
    "nan in k": (1, (0, 4, 2), math.nan),
    "+inf in k": (1, (1, 6, 0), math.inf),
    "-inf in k": (1, (0, 0, 1), -math.inf),
    "nan in v": (2, (1, 5, 1), math.nan),
    "-inf in v": (2, (0, 3, 0), -math.inf),
    "nan in q": (0, (0, 5, 3), math.nan),
    "+inf in q": (0, (1, 7, 0), math.inf),
    "-inf in q (masked row)": (0, (0, 0, 0), -math.inf),
    "nan in w_v": (5, (2,), math.nan),
    "inf in w_q": (3, (1, 1), math.inf),
    "-inf in w_k": (4, (0, 3), -math.inf),
}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("name", CORRUPT)
def test_nonfinite_inputs_poison_exactly_the_rows_that_read_them(backend, name):
    """Mask: bottom-right causal with Lq > Lk (the first rows have no key) and key padding
    (batch 1 sees keys < 8). Rows that read the bad value are NaN; the others equal the
    reference computed without it; rows without keys are 0 (P1 wins over P6)."""
    lq, lk = 12, 9
    mask = M.causal("bottom_right") & M.key_padding([9, 8])
    xs = make(lq=lq, lk=lk, seed=10)
    which, index, value = CORRUPT[name]
    xs[which][index] = value
    allowed = np.broadcast_to(mask.materialize(lq, lk).numpy(), (2, lq, lk))
    bad_rows = np.zeros((2, lq), bool)
    bad_keys = np.zeros((2, lk), bool)
    if which == 0:
        bad_rows[index[:2]] = True
    elif which in (1, 2):
        bad_keys[index[:2]] = True
    else:
        bad_rows[:] = True
    nan_rows = _expected_nan_rows(allowed, bad_rows, bad_keys)
    assert nan_rows.any() or name.endswith("(masked row)")
    out, _ = run(xs, backend, mask)
    got = out.detach().numpy()
    assert np.isnan(got[nan_rows]).all(), "a row that reads a non-finite value must be NaN"
    empty = ~allowed.any(-1)
    assert (got[empty] == 0).all(), "rows without an allowed key must be 0"
    clean = ~nan_rows & ~empty
    # P6 leaves a non-finite v at a masked position unspecified; both additive backends replace
    # it by 0 before computing, so the rows that do not attend to it are exact
    xs[which][index] = 0.0  # clean rows do not read it (and the reference rejects non-finite)
    ref = reference(xs, mask)
    assert np.isfinite(got[clean]).all()
    assert rel_err(got[clean], ref.output[clean]) <= TOL


@pytest.mark.skipif(FUSED.available() is not None, reason=str(FUSED.available()))
def test_fully_masked_rows_have_zero_gradient_even_with_nan_inputs():
    """P1 in the fused kernel's backward: rows without keys (and their q, even NaN) get 0."""
    lq, lk = 10, 6
    mask = M.causal("bottom_right")  # rows 0-3 see nothing
    xs = make(lq=lq, lk=lk, seed=11)
    xs[0][:, 1] = math.nan  # inside a masked row
    out, x32 = run(xs, "additive_fused", mask, grad=True)
    assert (out[:, :4] == 0).all() and torch.isfinite(out).all()
    out.sum().backward()
    assert (x32[0].grad[:, :4] == 0).all()
    assert all(torch.isfinite(x.grad).all() for x in x32)


@pytest.mark.parametrize("backend", ["math"])  # additive_fused takes no bias (README)
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_float_mask_holding_nan_or_inf_is_refused(backend, value):
    """P6: a float mask (bias) with NaN or +inf is a ValueError naming the mask; -inf entries
    (not allowed) are fine."""
    xs = make()
    bias = torch.zeros(9, 11)
    bias[2, 3] = -math.inf
    run(xs, backend, M.from_tensor(bias.clone()))  # -inf alone: accepted
    bias[4, 5] = value
    with pytest.raises(ValueError, match=r"^mask: .*NaN or \+inf"):
        run(xs, backend, M.from_tensor(bias))

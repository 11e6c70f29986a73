"""Kernel bugs found by ``make fuzz``, each pinned by the smallest input that showed it.

- Additive attention's backward overflowed float32 while its forward did not: with v ~ 1e10 and
  w_v ~ 1e30 the scores (~1e30) fit float32, but the gradient of the tanh layer,
  dS_ij w_v (1 - tanh^2) ~ 1e40, does not; ``math`` returned inf - inf = NaN gradients of q,
  W_q and W_k whose true values are small (|dW_k| ~ 6e8). P5's bound now covers that
  intermediate (``attnkit.kernels.policy.additive``), so such calls run in float64.

- ``additive_fused`` computed tanh's derivative as 1 - t² from the float32 t = tanh(x): near
  saturation t is within an ulp of +-1 and 1 - t² keeps few bits (relative error 2e-5 in dq at
  x = -3.3, 1e-3 at |x| = 6). The kernels now compute 4z / (z + 1)² (z = e^(2x)) or
  4e / (1 + e)² (e = e^(-2|x|)), accurate to a few ulp, on both of their tanh paths; beyond
  |x| = 43.5 the derivative is 0 (the exp helper clamps its argument at -87: its 6.6e-38, times
  w_v ~ 1e30 and k ~ 1e3, made a gradient of 3e-5 where the true one is 0).

Reference: the same formula in float64 by torch autograd on the float32 inputs (independent of
the backends' kernels); float32 tolerance 1e-5 relative on every gradient whose terms fit
float32 (q's gradient cancels exactly and is checked against the size of its terms instead).
"""

from __future__ import annotations

import pytest
import torch

from attnkit import functional as F
from attnkit.kernels import BACKENDS
from tests.support.numerics import rel_err

TOL = 1e-5
EPS32 = torch.finfo(torch.float32).eps
FUSED = BACKENDS["additive_fused"]
ADDITIVE_BACKENDS = [
    pytest.param(
        "additive_fused",
        marks=pytest.mark.skipif(FUSED.available() is not None, reason=str(FUSED.available())),
    ),
    "math",
]


def _close(got: torch.Tensor, want: torch.Tensor, size: float) -> tuple[bool, float]:
    """||got - want|| <= TOL ||want|| + 4 eps32 ``size`` (a few float32 roundings of the terms
    that make up ``want``: the absolute floor for a gradient whose true value is 0), and the
    error."""
    err = float((got.double() - want).norm())
    return err <= TOL * float(want.norm()) + 4 * EPS32 * size, err


def _overflowing_backward_inputs(h: int) -> dict[str, torch.Tensor]:
    """The fuzz example (float32, Lq = 1, Lk = 2, d = 1): q ~ 1, k ~ 1e-30, v ~ 1e10,
    w_v ~ 1e30."""
    g = torch.Generator().manual_seed(0)
    x = {
        "q": torch.randn(1, 1, generator=g),
        "k": torch.randn(2, 1, generator=g) * 1e-30,
        "v": torch.randn(2, 1, generator=g) * 1e10,
        "w_q": torch.randn(h, 1, generator=g),
        "w_k": torch.randn(h, 1, generator=g),
        "w_v": torch.randn(h, generator=g) * 1e30,
    }
    return {n: t.float() for n, t in x.items()}


def _additive64(x: dict[str, torch.Tensor], d_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients of sum(out * d_out) in float64: out = softmax(w_v . tanh(W_q q + W_k k)) v."""
    xs = {n: t.double().requires_grad_() for n, t in x.items()}
    pre = (xs["q"] @ xs["w_q"].T)[:, None, :] + (xs["k"] @ xs["w_k"].T)[None, :, :]
    out = torch.softmax(torch.tanh(pre) @ xs["w_v"], dim=-1) @ xs["v"]
    out.backward(d_out.double())
    return {n: t.grad for n, t in xs.items()}


@pytest.mark.parametrize("backend", ADDITIVE_BACKENDS)
@pytest.mark.parametrize("h", [1, 2])
def test_additive_backward_that_overflows_float32_runs_in_float64(backend, h):
    x = _overflowing_backward_inputs(h)
    d_out = torch.tensor([[0.7]])
    want = _additive64(x, d_out)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    args = [leaves[n] for n in ("q", "k", "v", "w_q", "w_k", "w_v")]
    out = F.additive_attention(*args, backend=backend)
    assert out.dtype == torch.float32
    out.backward(d_out)
    # the size of each gradient's terms, its absolute floor (w_v's true gradient can be exactly
    # 0: both keys' tanh rows are equal in float64, so the dS_j w_v-terms cancel)
    dv_max = 2 * 0.7 * float(x["v"].double().abs().max())  # |dS_j| <= 2 |d_out| max|v|
    sizes = {
        "v": 0.7,
        "w_v": dv_max,
        "w_k": dv_max * float(x["w_v"].double().abs().sum()) * float(x["k"].double().abs().max()),
    }
    for n, size in sizes.items():  # true values well inside float32
        got = leaves[n].grad
        assert torch.isfinite(got).all(), f"{backend}: non-finite gradient of {n}"
        ok, err = _close(got, want[n], size)
        assert ok, f"{backend}: gradient of {n} off by {err:.3g}, |want| = {want[n].norm():.3g}"
    # dq and dW_q: sums of two terms of size |dS w_v W_q| ~ 1e39-1e40 that cancel (dS_1 = -dS_2,
    # equal tanh): finite, and zero to within a few float32 roundings of that size
    size = 2 * 0.7 * float(x["v"].double().abs().max()) * float(x["w_v"].double().abs().sum())
    for n, scale in (("q", x["w_q"]), ("w_q", x["q"])):
        got = leaves[n].grad
        assert torch.isfinite(got).all(), f"{backend}: non-finite gradient of {n}"
        bound = 4 * EPS32 * size * float(scale.double().abs().max())
        assert float((got.double() - want[n]).norm()) <= bound, f"{backend}: gradient of {n}"


@pytest.mark.skipif(FUSED.available() is not None, reason=str(FUSED.available()))
@pytest.mark.parametrize("far_key", [False, True], ids=["exp_form", "direct_form"])
def test_additive_fused_tanh_derivative_near_saturation(far_key):
    """Every pre-activation W_q q_i + W_k k_j between 4.5 and 6.5 in magnitude (1 - tanh² from
    1e-5 to 5e-4, where 1 - t² from a float32 t is off by 1e-4..1e-2); ``far_key`` adds a key
    whose projection exceeds the exp form's range (the kernels then evaluate tanh directly)."""
    g = torch.Generator().manual_seed(3)
    lq, lk, h = 3, 6, 4
    sign = torch.where(torch.rand(lk, h, generator=g) < 0.5, -1.0, 1.0)
    x = {
        "q": torch.rand(lq, 2, generator=g) - 0.5,
        "k": sign * (5.5 + 0.5 * torch.rand(lk, h, generator=g)),
        "v": torch.randn(lk, 5, generator=g),
        "w_q": (torch.rand(h, 2, generator=g) - 0.5) / 2,
        "w_k": torch.eye(h),
        "w_v": torch.randn(h, generator=g),
    }
    if far_key:
        x["k"][-1] *= 5
    x = {n: t.float() for n, t in x.items()}
    d_out = torch.randn(lq, 5, generator=g).float()
    want = _additive64(x, d_out)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    args = [leaves[n] for n in ("q", "k", "v", "w_q", "w_k", "w_v")]
    F.additive_attention(*args, backend="additive_fused").backward(d_out)
    for n, t in leaves.items():
        assert rel_err(t.grad, want[n]) <= TOL, (
            f"gradient of {n} off by {rel_err(t.grad, want[n]):.3g}"
        )


@pytest.mark.skipif(FUSED.available() is not None, reason=str(FUSED.available()))
def test_additive_fused_saturated_tanh_has_zero_derivative():
    """The fuzz example: pre-activations of about -1200 and -8800 (tanh = -1 exactly, derivative
    e^-2400 = 0 in every float format) and w_v ~ 1e30: the gradients of k and W_k are 0."""
    x = {
        "q": torch.tensor([[1.5409961]]),
        "k": torch.tensor([[-2934.289], [-21787.893]]),
        "v": torch.tensor([[0.5684313], [-1.0845224]]),
        "w_q": torch.tensor([[-1.3985955]]),
        "w_k": torch.tensor([[0.4033468]]),
        "w_v": torch.tensor([8.380263e29]),
    }
    d_out = torch.tensor([[0.7]])
    want = _additive64(x, d_out)
    assert float(want["w_k"].abs().max()) == 0.0 and float(want["k"].abs().max()) == 0.0
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    args = [leaves[n] for n in ("q", "k", "v", "w_q", "w_k", "w_v")]
    F.additive_attention(*args, backend="additive_fused").backward(d_out)
    for n in ("q", "k", "w_q", "w_k"):
        assert float(leaves[n].grad.abs().max()) == 0.0, f"gradient of {n}: {leaves[n].grad}"
    assert rel_err(leaves["v"].grad, want["v"]) <= TOL

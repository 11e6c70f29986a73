"""The float64 fallback is visible (issue 19): a call the overflow policy (P5) computes in float64
warns once per process with ``attnkit.PrecisionWarning`` naming the bound, the tensors and the
cost; ``explain_dispatch`` says "runs in float64 because ..."; ordinary calls say nothing.
Outputs are checked against torch's math in float64 (atol 1e-6 + rtol 1e-5)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import attnkit
from attnkit import functional as F
from attnkit.kernels.policy import precision


@pytest.fixture
def fresh(monkeypatch):
    """A process in which no call has warned yet."""
    monkeypatch.setattr(precision, "_warned", False)


def qkv(scale: float, grad: bool = False, d: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 7, d, generator=g) for _ in range(3))
    return (q * scale).requires_grad_(grad), (k * scale).requires_grad_(grad), v


def sdpa64(q, k, v):
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1) @ v.double()


def test_the_warning_is_exported_and_a_user_warning():
    assert issubclass(attnkit.PrecisionWarning, UserWarning)
    assert attnkit.PrecisionWarning is precision.PrecisionWarning


@pytest.mark.parametrize("backend", ["dense", "math", "blocksparse"])
def test_overflow_warns_once_with_bound_tensors_and_cost(fresh, backend):
    q, k, v = qkv(1e19)  # scores ~1e39: beyond float32
    mask = attnkit.masks.causal() if backend == "blocksparse" else None
    with pytest.warns(attnkit.PrecisionWarning) as rec:
        out = F.scaled_dot_product_attention(q, k, v, mask, backend=backend)
    msg = str(rec[0].message)
    assert "runs in float64 because" in msg and "overflow limit" in msg
    assert "q (max |entry|" in msg and "k (max |entry|" in msg and "Cost:" in msg
    assert "PrecisionWarning" in msg  # how to silence it
    assert rec[0].filename == __file__  # points at the caller, not at attnkit's insides
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.scaled_dot_product_attention(q, k, v, mask, backend=backend)  # once per process
    assert out.dtype == torch.float32
    if mask is None:  # the float64 result, rounded
        want = sdpa64(q, k, v).float()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


def test_gradient_bound_warns_and_explain_dispatch_says_why(fresh):
    """randn * 30 at d = 64 with gradients: the policy's exact-backward bound sends it to
    float64 (the cliff of issue 19)."""
    q, k, v = qkv(30.0, grad=True)
    d = F.explain_dispatch(q, k, v)
    assert d.precision is not None and d.precision.startswith("runs in float64 because")
    assert "gradients" in d.precision and "runs in float64 because" in str(d)
    with pytest.warns(attnkit.PrecisionWarning, match="needs gradients"):
        out = F.scaled_dot_product_attention(q, k, v)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_ordinary_calls_are_silent_and_explained_without_float64(fresh):
    q, k, v = qkv(1.0, grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    d = F.explain_dispatch(q, k, v)
    assert d.precision is None and "float64" not in str(d)


def test_float64_inputs_never_warn(fresh):
    q, k, v = (t.double() for t in qkv(1e19))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.scaled_dot_product_attention(q, k, v)


def test_it_can_be_silenced(fresh):
    q, k, v = qkv(1e19)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=attnkit.PrecisionWarning)
        F.scaled_dot_product_attention(q, k, v)
    assert not [w for w in rec if issubclass(w.category, attnkit.PrecisionWarning)]


@pytest.mark.parametrize("backend", ["additive_fused", "math"])
def test_additive_overflow_warns_naming_w_v(fresh, backend):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 5, 4, generator=g), torch.randn(2, 6, 4, generator=g)
    v = torch.randn(2, 6, 3, generator=g)
    w_q, w_k = torch.randn(7, 4, generator=g), torch.randn(7, 4, generator=g)
    w_v = torch.full((7,), 1e38)  # sum |w_v| = 7e38 > float32's max
    d = F.explain_dispatch(q, k, v, kind="additive", w_q=w_q, w_k=w_k, w_v=w_v, backend=backend)
    assert d.precision is not None and "w_v (sum of |entries|" in d.precision
    with pytest.warns(attnkit.PrecisionWarning, match="the scores"):
        out = F.additive_attention(q, k, v, w_q, w_k, w_v, backend=backend)
    assert torch.isfinite(out).all()

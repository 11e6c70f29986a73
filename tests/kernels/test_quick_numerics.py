"""``numerics.quick_numerics`` (the cheap per-call scan) never decides differently from
``numerics.numerics`` (the policy's definition): whenever it caches an outcome, a fresh call
through the full scan reaches the same compute dtype, finiteness and fused-backward verdict;
and it declines (so the full scan runs) for non-finite inputs, biased masks and half types."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import masks as M
from attnkit.kernels import numerics as N
from attnkit.kernels.base import AttentionCall

MAGNITUDES = (1e-30, 1.0, 1e3, 1e8, 1e15, 1e18, 1e19, 1e150)


def _call(dtype, magnitude, grad, mask=None, special=None, shape=(2, 3, 7, 8)):
    gen = torch.Generator().manual_seed(int(math.log10(magnitude) + 40))
    q, k, v = (
        (torch.randn(shape, generator=gen, dtype=torch.float64) * magnitude).to(dtype)
        for _ in range(3)
    )
    if special is not None:
        name, value = special
        {"q": q, "k": k, "v": v}[name][0, 1, 2, 3] = value
    q.requires_grad_(grad)
    return AttentionCall("dot", q, k, v, mask=mask, scale=1 / math.sqrt(shape[-1]))


def _full(call):
    fresh = AttentionCall("dot", call.q, call.k, call.v, mask=call.mask, scale=call.scale)
    return N.numerics(fresh), N.fused_backward_ok(fresh)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("magnitude", MAGNITUDES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_same_outcome_as_the_full_scan(dtype, magnitude, grad):
    for mask in (None, M.causal(), M.key_padding([3, 7])):
        call = _call(dtype, magnitude, grad, mask)
        if N.quick_numerics(call):
            assert (call._cache["numerics"], call._cache["fused-backward-ok"]) == _full(call)
        else:
            assert "numerics" not in call._cache


def test_decides_ordinary_calls():
    """It settles the common case (moderate values, with and without gradients)."""
    for grad in (False, True):
        call = _call(torch.float32, 1.0, grad, M.causal())
        assert N.quick_numerics(call)
        assert call._cache["numerics"] == (torch.float32, True)


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_declines_non_finite_inputs(name, value):
    call = _call(torch.float32, 1.0, False, special=(name, value))
    assert not N.quick_numerics(call)
    assert N.numerics(call)[1] is False  # the full scan then finds the non-finite input


def test_declines_overflowing_and_biased_and_half_calls():
    assert not N.quick_numerics(_call(torch.float32, 1e19, False))  # scores near float32 max
    assert N.numerics(_call(torch.float32, 1e19, False))[0] == torch.float64
    bias = torch.zeros(7, 7)
    assert not N.quick_numerics(_call(torch.float32, 1.0, False, M.from_additive(bias)))
    assert not N.quick_numerics(_call(torch.bfloat16, 1.0, False))

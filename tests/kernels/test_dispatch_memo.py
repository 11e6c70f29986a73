"""The remembered dispatch (``attnkit.kernels.dispatch.CACHE``) can never give a stale answer.

What is remembered per call signature is validation and the backend choice; never anything
that depends on tensor values (the NaN/overflow policy scans every call). Each test changes one
thing a cached entry could wrongly survive (values of q/k/v in place, a mask tensor in place,
layout, dtype, requires_grad of a mask tensor or of a mask object's bias, inference tensors)
and compares the result with the float64 reference and the choice with ``explain_dispatch``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.calls import parse
from attnkit.kernels import dispatch
from attnkit.kernels.call.base import AttentionCall
from tests.support.numerics import TOL, rel_err


@pytest.fixture(autouse=True)
def fresh_cache():
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def _qkv(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, dtype=dtype) for _ in "qkv")


def _ref(q, k, v, allowed=None, bias=None):
    mask = None
    if allowed is not None or bias is not None:
        a = np.ones((q.shape[-2], k.shape[-2]), bool) if allowed is None else allowed.numpy()
        mask = np.where(a, 0.0 if bias is None else bias.detach().double().numpy(), -np.inf)
    qn, kn, vn = (t.detach().double().numpy() for t in (q, k, v))
    return R.scaled_dot_product(qn, kn, vn, mask=mask).output


def test_values_changed_in_place_are_scanned_again():
    """Same signature, new values: overflow (float64 path) and NaN (P6) are seen every call."""
    q, k, v = _qkv(1, 2, 33, 8)
    out = F.scaled_dot_product_attention(q, k, v)
    assert rel_err(out, _ref(q, k, v)) <= TOL[torch.float32]
    q.mul_(3e18)  # scores near float32's max: computed in float64
    k.mul_(3e18)
    out = F.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all()
    assert rel_err(out, _ref(q, k, v)) <= TOL[torch.float32]
    k[0, 1, 5, 2] = math.nan
    out = F.scaled_dot_product_attention(q, k, v)
    assert torch.isnan(out[0, 1]).all() and torch.isfinite(out[0, 0]).all()
    assert len(dispatch.CACHE) == 1


def test_mask_tensor_changed_in_place_to_empty_rows():
    q, k, v = _qkv(2, 9, 4)
    allowed = torch.ones(9, 9, dtype=torch.bool)
    F.scaled_dot_product_attention(q, k, v, allowed)
    allowed[3] = False  # row 3 now has no key: output 0 (P1)
    allowed[5, ::2] = False
    out = F.scaled_dot_product_attention(q, k, v, allowed)
    assert torch.equal(out[:, 3], torch.zeros_like(out[:, 3]))
    keep = np.ones((9, 1), bool)
    keep[3] = False
    want = np.where(keep, _ref(q, k, v, allowed), 0.0)
    assert rel_err(out, want) <= TOL[torch.float32]
    assert len(dispatch.CACHE) == 2  # the version counter moved: a new signature


def test_layout_and_dtype_are_part_of_the_signature():
    q, k, v = _qkv(2, 3, 17, 8)
    variants = [
        (q, k, v),
        (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v),  # same shape, new strides
        (q, k.transpose(0, 1).contiguous().transpose(0, 1), v),
        tuple(t.double() for t in (q, k, v)),
    ]
    for a, b, c in variants:
        out = F.scaled_dot_product_attention(a, b, c, M.causal())
        assert out.dtype == a.dtype
        want = _ref(a, b, c, torch.ones(17, 17).tril().bool())
        assert rel_err(out, want) <= TOL[a.dtype]
    assert len(dispatch.CACHE) == len(variants)


def test_requires_grad_of_a_mask_tensor_is_part_of_the_signature():
    q, k, v = _qkv(1, 7, 4)
    bias = torch.randn(7, 7, generator=torch.Generator().manual_seed(1))
    F.scaled_dot_product_attention(q, k, v, bias)
    bias.requires_grad_()
    want = F.explain_dispatch(q, k, v, bias).chosen
    out = F.scaled_dot_product_attention(q, k, v, bias)
    assert len(dispatch.CACHE) == 2 and out.requires_grad
    out.sum().backward()
    assert bias.grad is not None and torch.isfinite(bias.grad).all()
    assert want is not None


def test_requires_grad_of_a_mask_objects_bias_is_part_of_the_signature():
    q, k, v = _qkv(1, 7, 4)
    bias = torch.randn(7, 7, generator=torch.Generator().manual_seed(2))
    mask = M.from_additive(bias)
    F.scaled_dot_product_attention(q, k, v, mask)
    for t in [t for t in vars(mask).values() if isinstance(t, torch.Tensor)]:
        t.requires_grad_()
    out = F.scaled_dot_product_attention(q, k, v, mask)
    assert len(dispatch.CACHE) == 2 and out.requires_grad


def test_inference_tensor_masks_are_never_remembered():
    """An inference tensor has no version counter: its changes could not be seen, so a call
    with one is checked and chosen afresh every time."""
    q, k, v = _qkv(2, 6, 4)
    with torch.inference_mode():
        allowed = torch.ones(6, 6, dtype=torch.bool)
        F.scaled_dot_product_attention(q, k, v, allowed)
        allowed[2] = False
        out = F.scaled_dot_product_attention(q, k, v, allowed)
    assert len(dispatch.CACHE) == 0
    assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))


def test_the_fast_path_builds_the_same_call():
    """A remembered signature's call (built without the dataclass's __init__) equals the
    checked one, field by field, and is as frozen, with a memo of its own."""
    q, k, v = _qkv(2, 3, 4)
    mask = M.causal()
    options = dict(scale=0.5, dropout_p=0.1, return_weights=True)
    slow = parse("dot", q, k, v, mask, **options)
    fast = parse("dot", q, k, v, mask, **options)
    assert slow.signature == fast.signature and dispatch.CACHE.get(fast.signature, mask)
    assert fast.call == slow.call and fast.call is not slow.call and fast.backend is slow.backend
    assert {f.name for f in dataclasses.fields(AttentionCall)} == set(vars(fast.call))
    assert fast.call.memo.entries is None and fast.call.memo is not slow.call.memo
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.call.scale = 2.0

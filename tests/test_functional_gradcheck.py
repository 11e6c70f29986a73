"""torch.autograd.gradcheck (float64, small sizes) of every public attention function, on
every backend that can serve a call needing gradients."""

from __future__ import annotations

import functools

import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from tests.support import backends
from tests.support import masks as S

# the backends auto considers plus those it never tries for the score kind (as before the move)
serving = functools.partial(backends.serving, ignore_speed=False)


def rand(gen: torch.Generator, *shape: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------------------------------------
# gradcheck (float64, small sizes), every backend that can serve a call needing grad
# ---------------------------------------------------------------------------------------------
GRAD_MASKS = [S.none(), S.causal("bottom_right"), S.key_padding([2, 0]), S.alibi(0.5) & S.causal()]
"""Catalogue masks (tests/support/masks.py); the first three also for additive attention."""


def _req(*ts):
    return [t.clone().requires_grad_() for t in ts]


@pytest.mark.parametrize(
    "spec", GRAD_MASKS, ids=["none", "causal_br", "key_padding", "alibi&causal"]
)
def test_gradcheck_scaled_and_unscaled(spec):
    mask = spec.mask
    gen = torch.Generator().manual_seed(13)
    q, k, v = _req(rand(gen, 2, 2, 3), rand(gen, 2, 3, 3), rand(gen, 2, 3, 2))
    names = serving("dot", q, k, v, mask, rw=False)
    assert {"math", "dense"} <= set(names), names
    for name in names:
        # full Jacobian for the scaled form; the unscaled form shares its code path, so the
        # cheaper random-projection check (fast_mode) is enough there
        for fn, fast in ((F.scaled_dot_product_attention, False), (F.dot_product_attention, True)):
            assert torch.autograd.gradcheck(
                lambda q, k, v, fn=fn, name=name: fn(q, k, v, mask, backend=name),
                (q, k, v),
                fast_mode=fast,
            ), (fn.__name__, name)
    # the weights are differentiable too (math backend)
    assert torch.autograd.gradcheck(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, return_weights=True)[1],
        (q, k, v),
        fast_mode=True,
    )


@pytest.mark.parametrize("spec", GRAD_MASKS[:3], ids=["none", "causal_br", "key_padding"])
def test_gradcheck_additive_and_general(spec):
    mask = spec.mask
    gen = torch.Generator().manual_seed(14)
    q, k, v = _req(rand(gen, 2, 2, 3), rand(gen, 2, 3, 2), rand(gen, 2, 3, 2))
    w_q, w_k, w_v = _req(rand(gen, 3, 3), rand(gen, 3, 2), rand(gen, 3))
    names = serving("additive", q, k, v, mask, rw=False, w_q=w_q, w_k=w_k, w_v=w_v)
    assert "math" in names
    for name in names:
        assert torch.autograd.gradcheck(
            lambda *a, name=name: F.additive_attention(*a, mask, backend=name),
            (q, k, v, w_q, w_k, w_v),
        ), name
    (w,) = _req(rand(gen, 3, 2))
    for name in serving("dot", q @ w, k, v, mask, rw=False):
        assert torch.autograd.gradcheck(
            lambda *a, name=name: F.general_attention(*a, mask, backend=name),
            (q, k, v, w),
            fast_mode=True,
        ), name


def test_gradcheck_multi_head():
    gen = torch.Generator().manual_seed(15)
    b, lq, lk, e, h, dk = 2, 3, 4, 4, 2, 2
    xq, xkv = _req(rand(gen, b, lq, e), rand(gen, b, lk, e))
    ws = _req(*(rand(gen, h * dk, e) for _ in range(3)), rand(gen, e, h * dk))
    bs = _req(*(rand(gen, h * dk) for _ in range(3)), rand(gen, e))
    mask = M.causal("bottom_right")
    probe = torch.zeros(b, h, lq, dk, requires_grad=True, dtype=torch.float64)
    names = serving(
        "dot",
        probe,
        probe[..., :1, :].expand(b, h, lk, dk),
        probe[..., :1, :].expand(b, h, lk, dk),
        mask,
        rw=False,
    )
    assert {"math", "dense"} <= set(names), names
    for name in names:

        def fn(xq, xkv, wq, wk, wv, wo, bq, bk, bv, bo, name=name):
            return F.multi_head_attention(
                xq, xkv, xkv, h, wq, wk, wv, wo, bq, bk, bv, bo, mask, backend=name
            )[0]

        assert torch.autograd.gradcheck(fn, (xq, xkv, *ws, *bs), fast_mode=True), name

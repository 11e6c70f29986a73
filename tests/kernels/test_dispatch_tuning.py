"""Dispatch, the blocksparse plans and the fused additive kernels follow the tuning in use
(:func:`attnkit.kernels.tuning.use` injects one; nothing here depends on this CPU's timings):
the choice and its cited constant, the remembered choices forgotten when the tuning changes,
and outputs under other block and tile sizes against the float64 reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import attnkit.kernels.blocksparse as bs
from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference
from attnkit.kernels import dispatch
from attnkit.kernels.tuning import DEFAULT, current, use
from tests.support.backends import chosen_backends


def _measured(**values) -> object:
    return dataclasses.replace(DEFAULT, **values, measured=tuple(values), measured_on="2026-01-02")


def _qkv(b, h, lq, d=32, lk=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    lk = lq if lk is None else lk
    return (
        torch.randn((b, h, lq, d), generator=g),
        torch.randn((b, h, lk, d), generator=g),
        torch.randn((b, h, lk, d), generator=g),
    )


def test_min_empty_decides_and_is_cited():
    """A window leaving about two thirds of the 128x64 blocks empty: blocksparse under the
    built-in 0.25, dense under a measured 0.8, whose reason quotes the constant and its source;
    a window leaving a third empty: blocksparse under the built-in value, dense under 0.4."""
    q, k, v = _qkv(1, 2, 1024)
    mask = M.sliding_window(150)
    d = F.explain_dispatch(q, k, v, mask)
    assert d.chosen == "blocksparse"
    (note,) = d.notes
    assert "(>= 25%), by blocksparse_min_empty = 0.25 (built-in default)" in note, note
    assert f"  blocksparse: chosen: {note}" in str(d).splitlines()
    with use(_measured(blocksparse_min_empty=0.8)):
        d = F.explain_dispatch(q, k, v, mask)
        assert current().blocksparse_min_empty == 0.8
    assert d.chosen == "dense", str(d)
    (why,) = d.reasons["blocksparse"]
    assert "(< 80%)" in why and "blocksparse_min_empty = 0.8" in why, why
    assert "measured by attnkit tune on 2026-01-02" in why, why
    assert F.explain_dispatch(q, k, v, mask).chosen == "blocksparse"  # restored
    wide = M.sliding_window(300)
    assert F.explain_dispatch(q, k, v, wide).chosen == "blocksparse"
    with use(_measured(blocksparse_min_empty=0.4)):
        assert F.explain_dispatch(q, k, v, wide).chosen == "dense"


def test_element_call_entries_decides_and_is_cited():
    """Key padding varying per element: dense under the built-in threshold (the per-element
    calls skip too little each), blocksparse when the threshold is 1 entry."""
    q, k, v = _qkv(4, 1, 512)  # one head: 57,344 skipped entries per call
    mask = M.key_padding(torch.tensor([512, 64, 64, 64]))
    d = F.explain_dispatch(q, k, v, mask)
    assert d.chosen == "dense" and "blocksparse_element_call_entries = 98,304" in str(d)
    assert "(built-in default)" in str(d)
    with use(_measured(blocksparse_element_call_entries=1)):
        assert F.explain_dispatch(q, k, v, mask).chosen == "blocksparse"


def test_remembered_choices_are_forgotten_when_the_tuning_changes():
    q, k, v = _qkv(1, 2, 1024)
    mask = M.sliding_window(150)
    F.scaled_dot_product_attention(q, k, v, mask)  # remembered: blocksparse
    assert len(dispatch.CACHE) >= 1
    with use(_measured(blocksparse_min_empty=0.9)):
        assert len(dispatch.CACHE) == 0
        with chosen_backends() as chosen:
            F.scaled_dot_product_attention(q, k, v, mask)
    assert chosen == ["dense"]


@pytest.mark.parametrize("block_q, block_kv", [(16, 32), (48, 16)])
@pytest.mark.parametrize("mask_name", ["window", "key_padding", "padding_window"])
def test_blocksparse_follows_the_tuned_block_sizes(block_q, block_kv, mask_name):
    lq, lk = 97, 130
    q, k, v = (t.double() for t in _qkv(2, 3, lq, 16, lk, seed=3))
    mask = {
        "window": M.sliding_window(20),
        "key_padding": M.key_padding(torch.tensor([130, 41])),
        "padding_window": M.key_padding(torch.tensor([130, 41])) & M.sliding_window(30),
    }[mask_name]
    with use(_measured(blocksparse_block_q=block_q, blocksparse_block_kv=block_kv)):
        got = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
        plan = bs.make_plan(_call(q, k, v, mask))
    if plan.kind == "band":
        assert plan.block == block_q
    else:
        assert {c.q0 % block_q for c in plan.calls} == {0}, (plan.calls, block_q)
    allowed = mask.materialize(lq, lk)
    allowed = allowed.reshape(allowed.shape[:-2] + (1,) * (4 - allowed.dim()) + (lq, lk))
    want = reference.scaled_dot_product(
        q.numpy(), k.numpy(), v.numpy(), mask=allowed.expand(2, 3, lq, lk).numpy()
    ).output
    assert np.abs(got.numpy() - want).max() <= 1e-12


def _call(q, k, v, mask):
    from attnkit.calls import parse

    return parse("dot", q, k, v, mask, backend="blocksparse").call


@pytest.mark.parametrize("tile", [(4, 8), (16, 64), (64, 256)])
def test_additive_kernels_follow_the_tuned_tile(tile):
    """Outputs and gradients under other tiles against float64 autograd of the formula, with
    a causal mask and Lq != Lk (partial, full and empty tiles)."""
    g = torch.Generator().manual_seed(5)
    lq, lk, h = 37, 71, 6
    xs = [
        torch.randn(s, generator=g, dtype=torch.float64)
        for s in [(2, lq, 8), (2, lk, 8), (2, lk, 5), (h, 8), (h, 8), (h,)]
    ]
    x64 = [x.clone().requires_grad_() for x in xs]
    x32 = [x.float().requires_grad_() for x in xs]
    allowed = M.causal("bottom_right").materialize(lq, lk)
    s = torch.tanh((x64[0] @ x64[3].T)[:, :, None] + (x64[1] @ x64[4].T)[:, None]) @ x64[5]
    want = torch.softmax(s.masked_fill(~allowed, -torch.inf), -1) @ x64[2]
    with use(_measured(additive_block_q=tile[0], additive_block_k=tile[1])):
        got = F.additive_attention(*x32, M.causal("bottom_right"), backend="additive_fused")
    assert (got.double() - want).abs().max() <= 1e-5 * max(want.abs().max(), 1e-3)
    go = torch.randn(want.shape, generator=g, dtype=torch.float64)
    want.backward(go)
    got.backward(go.float())
    for a, b in zip(x32, x64):
        err = (a.grad.double() - b.grad).abs().max()
        assert err <= 1e-4 * max(b.grad.abs().max(), 1e-3), err

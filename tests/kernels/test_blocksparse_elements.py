"""The ``blocksparse`` rows plan with one call per batch element: a mask that allows the same
keys in every row of an element (key padding, left padding) runs as one unmasked SDPA call per
element on exactly its keys; any other per-element mask keeps its tile masks. Outputs against
the float64 reference, gradients against the math backend in float64 (``check`` of
test_blocksparse.py), lengths 0, odd and block multiples, Lq != Lk, layouts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit.kernels.blocksparse as bs
from attnkit.kernels.blocksparse.planner import column_run, merge_row_blocks
from attnkit.kernels.blocksparse.tiles import Call
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.tuning import DEFAULT, use
from tests.kernels.test_blocksparse import check, inputs
from tests.support import masks as S

PER_ELEMENT = dataclasses.replace(DEFAULT, planner_call_s=1e-7)
"""A tuning whose cost model makes the rows plan take one call per element whenever any
element has fewer keys than the union."""


def _plan(spec: S.Spec, batch, lq, lk, block_q=16, block_kv=8):
    q = torch.zeros(batch + (lq, 8))
    k = torch.zeros(batch + (lk, 8))
    call = AttentionCall("dot", q, k, k, mask=spec.mask, scale=1.0)
    with use(PER_ELEMENT):
        return bs.make_plan(call, block_q, block_kv)


def test_key_padding_is_one_unmasked_call_per_element_on_its_exact_keys():
    lengths = [37, 0, 8, 1, 41]
    plan = _plan(S.key_padding(lengths), (5, 3), 50, 41)
    assert plan.kind == "rows"
    assert all(c.mask is None and c.row_ok is None for c in plan.calls)
    got = {c.p: (c.q0, c.q1, c.lo, c.hi) for c in plan.calls}
    assert len(plan.calls) == len(got) == 5
    for p, n in enumerate(lengths):
        q0, q1, lo, hi = got[p]
        assert (q0, q1) == (0, 50)
        assert hi - lo == n and (n == 0 or lo == 0)


def test_a_mask_that_differs_between_rows_keeps_its_tiles():
    plan = _plan(S.key_padding([30, 7]) & S.causal(), (2, 1), 40, 40)
    assert any(c.mask is not None for c in plan.calls)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 45), min_size=1, max_size=4),
    lq=st.integers(1, 40),
    extra=st.integers(0, 9),
    left=st.booleans(),
)
def test_column_masks_per_element_match_the_reference(lengths, lq, extra, left):
    """Key padding (right) or a bool (B, 1, Lq, Lk) tensor mask allowing the last keys (left
    padding), per element, against float64; gradients in float64."""
    lk = max(lengths) + extra
    if lk == 0:
        return
    b = len(lengths)
    n = torch.tensor(lengths)
    if left:
        allowed = torch.arange(lk)[None, :] >= (lk - n)[:, None]
        spec = S.tensor(allowed[:, None, None, :].expand(b, 1, lq, lk))
    else:
        spec = S.key_padding(lengths)
    q, k, v = inputs((b, 2), lq, lk, 8, 8, torch.float64, seed=lq + lk)
    with use(PER_ELEMENT):
        check(q, k, v, spec, 16, 8)


def test_strided_inputs_and_float32():
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(3, 33, 2, 8, generator=g).transpose(1, 2).requires_grad_() for _ in range(3)
    )
    with use(PER_ELEMENT):
        check(q, k, v, S.key_padding([33, 5, 17]), 16, 8, grads=False)


def test_column_run():
    t = torch.tensor
    assert column_run(t([[0, 1, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)) == (1, 3)
    assert column_run(t([[0, 1, 0, 1], [0, 1, 0, 1]], dtype=torch.bool)) is None  # two runs
    assert column_run(t([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)) is None  # rows differ
    assert column_run(torch.zeros(2, 3, dtype=torch.bool)) is None


@pytest.mark.parametrize("masked", [False, True])
def test_merge_row_blocks(masked):
    fm = torch.zeros(1, 1) if masked else None
    calls = [Call(0, 16, 0, 8, 0), Call(0, 16, 0, 24, 1), Call(16, 32, 0, 8, 0, fm)]
    calls += [Call(16, 32, 0, 24, 1), Call(32, 40, 0, 8, 0), Call(32, 40, 0, 16, 1)]
    got = [(c.p, c.q0, c.q1, c.lo, c.hi) for c in merge_row_blocks(calls)]
    if masked:  # element 0's masked block splits its rows
        want = [(0, 0, 16, 0, 8), (1, 0, 32, 0, 24), (0, 16, 32, 0, 8), (0, 32, 40, 0, 8)]
    else:
        want = [(0, 0, 40, 0, 8), (1, 0, 32, 0, 24)]
    want.append((1, 32, 40, 0, 16))
    assert got == want

"""One call's typed state (:mod:`attnkit.kernels.call.memo`): the numerics decision is made
once per call and says what the policy decided; the call's memo builds each entry once, keeps
entries of different key types apart, and is fresh for every call object."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import attnkit.masks as M
from attnkit.calls import parse
from attnkit.kernels import dispatch
from attnkit.kernels.additive.tiles import TilesKey
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.call.memo import BlockMapKey, CallMemo
from attnkit.kernels.policy import numerics as N
from attnkit.kernels.policy import scan as S
from attnkit.kernels.policy.decision import DECISION, NumericsDecision
from tests.support.block_maps import np_block_classes


def _call(magnitude: float, grad: bool = False, mask=None, lq: int = 7, lk: int = 9):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen) * magnitude for n in (lq, lk, lk))
    q.requires_grad_(grad)
    return AttentionCall("dot", q, k, v, mask=mask, scale=1 / math.sqrt(8))


def _bound(call: AttentionCall) -> float:
    """max|q| * max|k| * d * scale in float64 (the policy's cheap bound, recomputed here)."""
    qm, km = (float(t.detach().double().abs().max()) for t in (call.q, call.k))
    return qm * km * call.q.shape[-1] * call.scale


def _tight(call: AttentionCall) -> float:
    """max_i |q_i| * max_j |k_j| * scale (row 2-norms in float64, Cauchy-Schwarz)."""
    rows = [torch.linalg.vector_norm(t.detach().double(), dim=-1).max() for t in (call.q, call.k)]
    return float(rows[0] * rows[1]) * call.scale


@pytest.mark.parametrize("magnitude", [1.0, 1e9, 1e19])
def test_decision_is_made_once_and_matches_the_bound(magnitude):
    call = _call(magnitude)
    d = N.decision(call)
    assert (
        isinstance(d, NumericsDecision)
        and N.decision(call) is d
        and call.memo.entries[DECISION] is d
    )
    overflow = torch.finfo(torch.float32).max / N.OVERFLOW_MARGIN
    want64 = _bound(call) >= overflow and _tight(call) >= overflow
    assert (d.compute == torch.float64) == want64
    assert (d.float64_reason is not None) == want64 and d.finite
    assert N.numerics(call) == (d.compute, d.finite)
    assert N.fused_backward_ok(call) == d.fused_backward_ok
    assert N.float64_reason(call) is d.float64_reason


def test_decision_sees_non_finite_inputs():
    call = _call(1.0)
    call.v[0, 1, 2, 3] = math.inf
    assert N.decision(call).finite is False


def test_scores_too_large_for_an_exact_fused_backward_run_in_float64_with_gradients():
    """P5: |s| * eps(float32) >= 2**-10 (even by the tight row-norm bound) with gradients:
    float64, where the fused backward is exact; the same call without gradients: float32."""
    call = _call(3e2, grad=True)
    assert _tight(call) * torch.finfo(torch.float32).eps >= N.GRAD_SCORE_ERROR  # the precondition
    d = N.decision(call)
    assert d.compute == torch.float64 and d.fused_backward_ok and d.float64_reason is not None
    plain = N.decision(_call(3e2, grad=False))
    assert plain.compute == torch.float32 and plain.float64_reason is None


def test_memo_builds_each_entry_once_and_keeps_key_types_apart():
    memo, built = CallMemo(), []
    a = memo.get(BlockMapKey(4, 4), lambda: built.append("bm") or torch.zeros(1))
    assert memo.get(BlockMapKey(4, 4), lambda: built.append("again") or None) is a
    t = memo.get(TilesKey(4, 4), lambda: built.append("tiles") or "tiles")  # same fields
    assert t == "tiles" and built == ["bm", "tiles"]
    assert memo.get(BlockMapKey(4, 8), lambda: built.append("other") or 1) == 1
    assert built == ["bm", "tiles", "other"]


@pytest.mark.parametrize(
    "mask", [M.causal(), M.sliding_window(2, 1), M.key_padding([5, 9]) & M.causal()]
)
def test_block_map_in_the_memo_is_the_masks_exact_classes(mask):
    call = _call(1.0, mask=mask, lq=10, lk=11)
    bm = call.block_map(4, 3)
    assert call.block_map(4, 3) is bm  # kept
    want = np_block_classes(mask.materialize(10, 11).numpy(), 4, 3)
    np.testing.assert_array_equal(bm.numpy(), np.broadcast_to(want, bm.shape))


def test_every_call_object_has_its_own_memo():
    call = _call(1.0, mask=M.causal())
    N.decision(call)
    call.block_map(4, 4)
    other = dataclasses.replace(call, q=call.q * 1e19, k=call.k * 1e19)
    assert other.memo is not call.memo and not other.memo.entries
    assert N.decision(other).compute == torch.float64  # decided again, for the new q
    dispatch.clear_cache()
    checked = parse("dot", call.q, call.k, call.v, scale=0.5).call  # remembered, with its plan
    planned = parse("dot", call.q, call.k, call.v, scale=0.5).call  # from the remembered choice
    assert checked.memo.scan_plan is None
    assert planned.memo.scan_plan == S.plan3(call.q, call.k, call.v)
    assert planned.memo is not checked.memo

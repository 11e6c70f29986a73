"""The ``blocksparse`` backend's plans (band, docs, rows; cached on the mask) and the
dispatcher's choice and reasons for sparse and dense masks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnkit.kernels.blocksparse as bs
from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels.base import AttentionCall
from attnkit.kernels.tuning import DEFAULT, use


@pytest.fixture(autouse=True)
def xeon_rule():
    """The rule these tests pin down is the one measured on the project's Xeon (MIN_EMPTY 0.2
    there); the built-in default's own value is checked in test_dispatch_tuning.py."""
    with use(dataclasses.replace(DEFAULT, blocksparse_min_empty=0.2)):
        yield


def _sorted_ids(n, ndoc, g):
    return torch.sort(torch.randint(0, ndoc, (n,), generator=g)).values


# ---------------------------------------------------------------------------------------------
# plans and dispatch
# ---------------------------------------------------------------------------------------------
def _call(mask, lq=1025, lk=None, batch=(1, 2), d=16, dtype=torch.float32):
    lk = lq if lk is None else lk
    q = torch.zeros(batch + (lq, d), dtype=dtype)
    k = torch.zeros(batch + (lk, d), dtype=dtype)
    return AttentionCall("dot", q, k, k, mask=mask, scale=1.0)


def test_plan_kinds_and_plan_cache_on_the_mask():
    g = torch.Generator().manual_seed(0)
    ids = _sorted_ids(1025, 6, g)
    assert bs.make_plan(_call(M.sliding_window(64))).kind == "band"
    assert bs.make_plan(_call(M.sliding_window(64) & M.causal())).kind == "band"
    assert bs.make_plan(_call(M.document(ids))).kind == "docs"
    plan = bs.make_plan(_call(M.document(ids) & M.causal()))
    assert plan.kind == "docs" and all(c.is_causal for c in plan.calls)
    assert bs.make_plan(_call(M.key_padding([1000]), batch=(1, 2))).kind == "rows"
    m = M.key_padding([100, 900]) & M.causal()
    p1 = bs.make_plan(_call(m, batch=(2, 3)))
    assert bs.make_plan(_call(m, batch=(2, 3))) is p1  # reused for a new call of the same shape
    assert bs.make_plan(_call(m, batch=(2, 3), dtype=torch.float64)) is not p1


def _explain(mask, lq=1025, dtype=torch.float32, **kw):
    q = torch.zeros((1, 2, lq, 16), dtype=dtype)
    return F.explain_dispatch(q, q, q, mask, **kw)


def test_dispatch_picks_blocksparse_for_sparse_masks():
    g = torch.Generator().manual_seed(0)
    for mask in (
        M.sliding_window(64),
        M.sliding_window(64) & M.causal(),
        M.causal("bottom_right"),
        M.document(_sorted_ids(1025, 8, g)),
        M.prefix_lm(100),
    ):
        d = _explain(mask)
        assert d.chosen == "blocksparse", (mask, d)


def test_dispatch_reasons_for_dense_cases():
    r = _explain(None).reasons["blocksparse"]
    assert any("no mask" in x for x in r), r
    d = _explain(M.causal())
    assert d.chosen == "dense" and any("is_causal" in x for x in d.reasons["blocksparse"])
    r = _explain(M.sliding_window(2000)).reasons["blocksparse"]
    assert any("no 128x64 block empty" in x for x in r), r
    d = _explain(M.sliding_window(600))  # about 10% of the blocks empty
    assert d.chosen == "dense"
    assert any("leaves only" in x and "(< 20%)" in x for x in d.reasons["blocksparse"]), d
    r = _explain(M.sliding_window(64), return_weights=True).reasons["blocksparse"]
    assert any("weights" in x for x in r), r
    assert _explain(M.sliding_window(64), dropout_p=0.1).chosen == "blocksparse"  # issue 12
    q = torch.zeros((1, 2, 64, 16))
    with pytest.raises(ValueError, match="no mask"):
        F.scaled_dot_product_attention(q, q, q, backend="blocksparse")

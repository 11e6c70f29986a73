"""Grouped-query calls on ``blocksparse``: the G query heads of a key/value head folded into the
rows of one SDPA call per block (kernels/blocksparse/fold.py) when the mask is shared by the
heads, k/v repeated (today's path) when it varies per head. Against the float64 reference with
k and v repeated (tests/kernels/blocksparse_check.py): outputs and gradients of q, k, v and float
mask tensors, G = 1, 2, 4 and Hkv = 1, odd sizes, Lq != Lk, layouts, fully masked rows, window /
causal / document / padding / prefix / bias masks (every plan: band, docs, rows).
"""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import functional as F
from attnkit import heads, kernels
from attnkit import masks as M
from attnkit.kernels import blocksparse as bs
from attnkit.kernels import dispatch
from attnkit.kernels.call import base
from tests.kernels.blocksparse_check import check
from tests.support import layouts
from tests.support.numerics import rel_err

SHARED = (
    "window",
    "window&causal",
    "causal_br",
    "key_padding",
    "document",
    "document&causal",
    "prefix_lm_batch",
    "tensor_float_grad",
    "additive_grad",
    "window&tensor_grad",
    "key_padding_mask_float",
    "alibi&causal",
    "all_masked",
)
PER_HEAD = ("predicate_bh", "raw_float_grad")
GROUPS = ((4, 4), (4, 2), (8, 2), (4, 1), (2, 1))  # (H, Hkv): G = 1, 2, 4, 4, 2


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """blocksparse with 8 x 4 blocks accepting any sparsity, so that short inputs span blocks."""
    monkeypatch.setitem(kernels.BACKENDS, "blocksparse", bs.BlocksparseBackend(8, 4, 0.0))
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


@pytest.mark.parametrize("kind", SHARED + PER_HEAD)
@pytest.mark.parametrize("h,g", GROUPS)
def test_grouped_against_reference(h, g, kind):
    check(h, g, kind, lq=19, lk=23, seed=len(kind) + h + g)


@pytest.mark.parametrize("lq,lk", [(1, 1), (1, 9), (7, 7), (97, 61), (61, 97)])
@pytest.mark.parametrize("kind", ["window&causal", "key_padding", "document&causal", "window"])
def test_grouped_odd_sizes(kind, lq, lk):
    if kind.startswith("document") and lq != lk:
        lk = lq  # documents of the catalogue pair query and key ids
    check(8, 2, kind, lq=lq, lk=lk, seed=lq * lk)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_grouped_layouts(layout):
    check(8, 2, "window&causal", layout=layout, lq=33, lk=33, seed=1)
    check(4, 1, "tensor_float_grad", layout=layout, lq=17, lk=29, seed=2)


@pytest.mark.parametrize("kind", ["window&causal", "document&causal", "additive_grad"])
def test_grouped_float32(kind):
    check(8, 2, kind, dtype=torch.float32, lq=97, lk=97, seed=3)


class _Watch:
    """Records (q rows, q batch dims) of every fused SDPA call; ``forbid`` fails on any repeat
    of k/v heads."""

    def __init__(self, monkeypatch, forbid: bool):
        self.calls: list[tuple[int, tuple[int, ...]]] = []
        fwd = bs.tiles.sdpa_fwd

        def watched(q, k, v, mask, scale, is_causal):
            assert q.shape[:-2] == k.shape[:-2]
            self.calls.append((q.shape[-2], tuple(q.shape[:-2])))
            return fwd(q, k, v, mask, scale, is_causal)

        monkeypatch.setattr(bs.tiles, "sdpa_fwd", watched)
        if forbid:

            def no_repeat(*a, **kw):
                raise AssertionError("k/v heads were repeated")

            for mod in (heads, base):
                for attr in ("repeat_heads", "repeat_kv_heads"):
                    if hasattr(mod, attr):
                        monkeypatch.setattr(mod, attr, no_repeat)


@pytest.mark.parametrize(
    "mask,fused_rows",
    [
        (M.sliding_window(4) & M.causal(), 8 * 4),  # band: interior blocks of 8 rows x G
        (M.key_padding([40, 17]), 8 * 4),  # rows plan
        (M.document(torch.tensor([0] * 20 + [1] * 20)), 20 * 4),  # docs plan, one call per doc
    ],
)
def test_shared_mask_folds_heads_and_never_repeats_kv(monkeypatch, mask, fused_rows):
    """A shared mask: no repeat of k/v (forward and backward); SDPA calls see B * Hkv = 4 (not
    H = 8 or B * H = 16) batch-heads and G * block query rows."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 40, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 40, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    want = F.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), mask, backend="math"
    )
    w = _Watch(monkeypatch, forbid=True)
    out = F.grouped_query_attention(q, k, v, mask, backend="blocksparse")
    out.sum().backward()
    assert w.calls and all(8 not in s and 16 not in s for _, s in w.calls), w.calls
    assert max(r for r, _ in w.calls) == fused_rows, w.calls
    assert rel_err(out, want.detach()) <= 1e-10


def test_per_head_mask_repeats_kv(monkeypatch):
    """A mask that varies over the heads keeps the repeated path: SDPA sees B * H = 12 heads."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 16, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 16, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = M.from_tensor(torch.rand((2, 6, 16, 16), generator=gen) > 0.5)
    w = _Watch(monkeypatch, forbid=False)
    F.grouped_query_attention(q, k, v, mask, backend="blocksparse")
    assert w.calls and all(math.prod(s) == 2 * 6 for _, s in w.calls), w.calls


@pytest.mark.parametrize("case", ["nan_k", "huge_scores_grad"])
def test_grouped_off_the_fused_path(case):
    """Non-finite inputs (P6) and scores too large for a fused backward take the repeated path:
    the same values (and NaN rows) as math on repeated heads."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 6, 21, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 21, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    if case == "nan_k":
        k[0, 1, 3, 0] = math.nan
    else:
        q = q * 1e13  # |s| * eps(float64) >= 2**-10: no fused backward
    q.requires_grad_(case != "nan_k")
    mask = M.sliding_window(3) & M.causal()
    out = F.grouped_query_attention(q, k, v, mask, backend="blocksparse")
    want = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask, backend="math"
    )
    assert torch.equal(out.isnan(), want.isnan())
    assert out.isnan().any() == (case == "nan_k")
    ok = ~want.isnan()
    assert rel_err(out[ok], want[ok].detach()) <= 1e-10
    if case != "nan_k":
        (ga,) = torch.autograd.grad(out.sum(), q)
        (gb,) = torch.autograd.grad(want.sum(), q)
        assert rel_err(ga, gb) <= 1e-9

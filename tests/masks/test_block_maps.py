"""attnkit.masks block maps: exact against an explicit loop over blocks of the materialised
mask (hypothesis over every mask kind and combination), cheap at 16k (never the full grid) and
kept in bounded, separate LRU caches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import masks as M
from tests.support.block_maps import FULL, PARTIAL, np_block_classes


# ---------------------------------------------------------------------------------------------
# block maps: exact (vs an explicit loop over the materialised grid), cheap, cached
# ---------------------------------------------------------------------------------------------
@st.composite
def leaf_masks(draw, lq: int, lk: int, batch: int):
    kind = draw(
        st.sampled_from(
            [
                "causal",
                "window",
                "key_padding",
                "document",
                "document_kv",
                "prefix",
                "prefix_b",
                "predicate",
                "tensor",
                "tensor_float",
                "kpm",
                "alibi",
                "alibi_heads",
                "window_huge",
            ]
        )
    )
    al = draw(st.sampled_from(["top_left", "bottom_right"]))
    small = st.integers(0, 9)
    if kind == "causal":
        return M.causal(al)
    if kind == "window":
        return M.sliding_window(draw(small), draw(small), alignment=al)
    if kind == "key_padding":
        return M.key_padding(draw(st.lists(st.integers(0, lk + 2), min_size=batch, max_size=batch)))
    if kind in ("document", "document_kv"):
        n = draw(st.integers(1, 4))
        sort = draw(st.booleans())
        ids = draw(st.lists(st.integers(0, n), min_size=lq, max_size=lq))
        kv = draw(st.lists(st.integers(0, n), min_size=lk, max_size=lk))
        ids, kv = (sorted(ids), sorted(kv)) if sort else (ids, kv)
        if kind == "document" and lq == lk:
            return M.document(ids)
        return M.document([ids] * batch, [kv] * batch) if batch > 1 else M.document(ids, kv)
    if kind == "window_huge":
        return M.sliding_window(2**62, draw(small), alignment=al)
    if kind == "prefix":
        return M.prefix_lm(draw(small), al)
    if kind == "prefix_b":
        return M.prefix_lm(draw(st.lists(small, min_size=batch, max_size=batch)), alignment=al)
    if kind == "predicate":
        mod = draw(st.integers(2, 5))
        return M.from_predicate(
            lambda b, h, q, k: (q * 3 + k + b) % mod != 0, batch_size=batch, alignment=al
        )
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if kind == "tensor":
        return M.from_tensor(torch.rand((batch, 1, lq, lk), generator=g) > 0.3)
    if kind == "tensor_float":
        t = torch.randn((lq, lk), generator=g, dtype=torch.float64)
        return M.from_tensor(t.masked_fill(t < -0.8, -math.inf))
    if kind == "kpm":
        return M.from_key_padding_mask(torch.rand((batch, lk), generator=g) > 0.7)
    if kind == "alibi_heads":
        return M.ALiBi(torch.tensor([0.5, 0.125]))
    return M.alibi(0.5)


@st.composite
def masks_and_sizes(draw):
    lq, lk = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    batch = draw(st.sampled_from([1, 3]))
    a = draw(leaf_masks(lq, lk, batch))
    b = draw(leaf_masks(lq, lk, batch))
    op = draw(st.sampled_from(["a", "and", "or"]))
    if op == "or" and (a.has_bias or b.has_bias):
        op = "and"
    mask = a if op == "a" else (a & b if op == "and" else a | b)
    if draw(st.booleans()) and not mask.has_bias:
        mask = mask & draw(leaf_masks(lq, lk, batch)) if draw(st.booleans()) else mask
    bq, bk = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    return mask, lq, lk, bq, bk


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masks_and_sizes())
def test_block_map_agrees_with_materialize(case):
    mask, lq, lk, bq, bk = case
    got = mask.block_map(lq, lk, bq, bk).numpy()
    want = np_block_classes(mask.materialize(lq, lk).numpy(), bq, bk)
    if mask.has_bias:  # a block with a bias is never skipped as "full"
        want = np.where(want == FULL, PARTIAL, want)
    assert got.shape == mask.batch_shape + want.shape[-2:]
    np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape), err_msg=repr(mask))


@pytest.mark.parametrize(
    "mask",
    [
        M.sliding_window(2, 0) | M.sliding_window(0, 2),  # two partial bands covering a block
        M.causal() & M.sliding_window(0, 3, alignment="bottom_right"),  # partial & partial = empty
        M.document([0, 1] * 8) & M.causal(),  # unsorted documents
    ],
)
def test_block_map_is_exact_where_parts_are_partial(mask):
    got = mask.block_map(16, 16, 4, 4).numpy()
    want = np_block_classes(mask.materialize(16, 16).numpy(), 4, 4)
    np.testing.assert_array_equal(got, want)


class _TileWatch:
    """Records the size of every mask evaluation (Mask.tile) while active."""

    def __init__(self, monkeypatch):
        self.sizes: list[int] = []
        orig = M.Mask.tile

        def tile(mask, q0, q1, k0, k1, q_len, kv_len):
            out = orig(mask, q0, q1, k0, k1, q_len, kv_len)
            self.sizes.append(out.numel())
            return out

        monkeypatch.setattr(M.Mask, "tile", tile)


L16K = 16384


def _structured_16k():
    g = torch.Generator().manual_seed(0)
    cuts = torch.sort(torch.randperm(L16K - 1, generator=g)[:7] + 1).values
    ids = torch.zeros(L16K, dtype=torch.long)
    for c in cuts.tolist():
        ids[c:] += 1
    lengths = [L16K, 9000, 100]
    return [
        M.causal(),
        M.causal("bottom_right"),
        M.sliding_window(128),
        M.sliding_window(128) & M.causal(),
        M.key_padding(lengths),
        M.key_padding(lengths) & M.causal(),
        M.key_padding(lengths) & M.sliding_window(64),
        M.document(ids),
        M.document(ids[torch.randperm(L16K, generator=g)]),  # unsorted
        M.document(ids) & M.causal(),
        M.document(torch.stack([ids, ids.flip(0).max() - ids.flip(0)])) & M.sliding_window(256),
        M.prefix_lm(1000),
        M.prefix_lm([10, 5000, 16000]) & M.key_padding(lengths),
        M.sliding_window(64) | M.prefix_lm(300),
        M.alibi(0.1) & M.sliding_window(128),
    ]


@pytest.mark.parametrize("index", range(len(_structured_16k())))
def test_block_maps_at_16k_never_build_the_full_grid(index, monkeypatch):
    mask = _structured_16k()[index]
    watch = _TileWatch(monkeypatch)
    bm = mask.block_map(L16K, L16K, 128, 64)
    assert bm.shape[-2:] == (128, 256)
    batch = max(1, math.prod(mask.batch_shape))
    # nothing close to Lq x Lk is ever evaluated: at most a block row at a time, and a few
    # block rows in all (exact refinement of blocks where two parts are both partial)
    assert max(watch.sizes, default=0) <= batch * 128 * L16K, repr(mask)
    assert sum(watch.sizes) <= batch * 64 * 128 * L16K // 16, repr(mask)
    # spot-check exactness on a few block rows against the evaluated mask
    for qb in (0, 37, 127):
        rows = mask.tile(qb * 128, (qb + 1) * 128, 0, L16K, L16K, L16K)
        want = np_block_classes(rows.numpy(), 128, 64)[..., 0, :]
        if mask.has_bias:
            want = np.where(want == FULL, PARTIAL, want)
        np.testing.assert_array_equal(
            bm[..., qb, :].numpy(), np.broadcast_to(want, bm[..., qb, :].shape)
        )


def test_block_map_is_cached_per_mask_and_shape():
    m = M.sliding_window(5) & M.key_padding([7, 20])
    a = m.block_map(30, 20, 4, 3)
    assert m.block_map(30, 20, 4, 3) is a
    b = m.block_map(30, 20, 3, 4)
    assert b is not a and b.shape == (2, 10, 5)
    assert m.block_map(29, 20, 4, 3).shape == (2, 8, 7)


def test_block_map_and_plan_caches_are_separate_bounded_lrus():
    m = M.sliding_window(1)
    keep = m.block_map(5, 5, 4, 4)
    for n in range(6, 100):
        m.block_map(n, n, 4, 4)
        assert m.block_map(5, 5, 4, 4) is keep  # used at every step: never evicted
    assert len(m.block_map_cache) <= 2 * M.BLOCK_MAP_CACHE_SIZE
    assert m.block_map(6, 6, 4, 4) is not None and len(m.plan_cache) == 0
    plans = m.plan_cache
    assert plans is m.plan_cache and plans is not m.block_map_cache
    for n in range(3 * M.PLAN_CACHE_SIZE):
        plans.put(("plan", n), n)
        assert plans.get(("plan", 0)) == 0  # recently used: kept
    assert len(plans) == M.PLAN_CACHE_SIZE and ("plan", 1) not in plans
    assert plans.get("missing", "default") == "default"
    with pytest.raises(ValueError, match="maxsize"):
        M.LRUCache("x", 0)

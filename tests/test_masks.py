"""attnkit.masks: every mask kind against a one-line NumPy construction, block maps against the
materialised mask (exact, cheap, cached), the docstring grids, and bad constructor arguments.

The oracles here are NumPy expressions and explicit loops over blocks, never the masks' own
code paths.
"""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import masks as M

EMPTY, PARTIAL, FULL = 0, 1, 2


def np_block_classes(grid: np.ndarray, bq: int, bk: int) -> np.ndarray:
    """Reference block classes by an explicit loop over blocks of a (..., Lq, Lk) bool grid."""
    lq, lk = grid.shape[-2:]
    nq, nk = -(-lq // bq), -(-lk // bk)
    out = np.empty(grid.shape[:-2] + (nq, nk), dtype=np.int8)
    for a in range(nq):
        for b in range(nk):
            blk = grid[..., a * bq : (a + 1) * bq, b * bk : (b + 1) * bk]
            out[..., a, b] = np.where(
                blk.all(axis=(-1, -2)), FULL, np.where(blk.any(axis=(-1, -2)), PARTIAL, EMPTY)
            )
    return out


def ij(lq: int, lk: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(lq)[:, None], np.arange(lk)[None, :]


# ---------------------------------------------------------------------------------------------
# every mask kind vs NumPy
# ---------------------------------------------------------------------------------------------
SIZES = [(1, 1), (7, 7), (5, 9), (9, 5), (97, 61)]


@pytest.mark.parametrize("lq,lk", SIZES)
def test_causal_both_alignments(lq, lk):
    got_tl = M.causal().materialize(lq, lk).numpy()
    got_br = M.causal("bottom_right").materialize(lq, lk).numpy()
    np.testing.assert_array_equal(got_tl, np.tri(lq, lk, 0, dtype=bool))
    np.testing.assert_array_equal(got_br, np.tri(lq, lk, lk - lq, dtype=bool))


@pytest.mark.parametrize("lq,lk", SIZES)
@pytest.mark.parametrize("left,right", [(0, 0), (1, 1), (2, 0), (0, 3), (4, 1)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_sliding_window(lq, lk, left, right, alignment):
    off = lk - lq if alignment == "bottom_right" else 0
    want = np.tri(lq, lk, right + off, dtype=bool) & ~np.tri(lq, lk, off - left - 1, dtype=bool)
    got = M.sliding_window(left, right, alignment=alignment).materialize(lq, lk).numpy()
    np.testing.assert_array_equal(got, want)
    both = (M.sliding_window(left, right, alignment=alignment) & M.causal(alignment)).materialize(
        lq, lk
    )
    np.testing.assert_array_equal(both.numpy(), want & np.tri(lq, lk, off, dtype=bool))


def test_sliding_window_right_defaults_to_left():
    np.testing.assert_array_equal(
        M.sliding_window(3).materialize(11, 13), M.sliding_window(3, 3).materialize(11, 13)
    )


@pytest.mark.parametrize("lq,lk", SIZES)
def test_key_padding(lq, lk):
    lengths = np.array([0, 1, lk // 2, lk, lk + 3])
    got = M.key_padding(lengths).materialize(lq, lk).numpy()
    want = np.broadcast_to(np.arange(lk)[None, None, :] < lengths[:, None, None], (5, lq, lk))
    np.testing.assert_array_equal(got, want)


def test_document_sorted_unsorted_batched_and_kv_ids():
    rng = np.random.default_rng(0)
    for ids in (np.sort(rng.integers(0, 4, 37)), rng.integers(0, 4, 37), np.zeros(5, int)):
        got = M.document(ids).materialize(len(ids), len(ids)).numpy()
        np.testing.assert_array_equal(got, ids[:, None] == ids[None, :])
    ids, kv = rng.integers(0, 3, (2, 11)), rng.integers(0, 3, (2, 6))
    got = M.document(ids, kv_ids=kv).materialize(11, 6).numpy()
    np.testing.assert_array_equal(got, ids[:, :, None] == kv[:, None, :])
    assert M.document(ids, kv_ids=kv).batch_shape == (2,)


@pytest.mark.parametrize("lq,lk", SIZES)
def test_prefix_lm_int_and_per_batch(lq, lk):
    i, j = ij(lq, lk)
    for p in (0, 2, lk, lk + 4):
        got = M.prefix_lm(p).materialize(lq, lk).numpy()
        np.testing.assert_array_equal(got, (j < p) | (j <= i))
    ps = np.array([0, 3, lk])
    got = M.prefix_lm(ps).materialize(lq, lk).numpy()
    np.testing.assert_array_equal(got, (j[None] < ps[:, None, None]) | (j <= i)[None])


def test_from_predicate_with_batch_and_heads():
    def fn(b, h, q, k):
        return (q + 2 * k + b + 3 * h) % 4 != 0

    for bs, nh, shape in ((None, None, ()), (3, None, (3,)), (None, 2, (1, 2)), (3, 2, (3, 2))):
        m = M.from_predicate(fn, batch_size=bs, num_heads=nh)
        assert m.batch_shape == shape
        got = m.materialize(7, 9).numpy()
        want = np.fromfunction(
            lambda b, h, q, k: (q + 2 * k + b + 3 * h) % 4 != 0,
            (bs or 1, nh or 1, 7, 9),
            dtype=int,
        )
        np.testing.assert_array_equal(got, want.reshape(shape + (7, 9)))


def test_from_predicate_using_heads_only_lines_up_with_the_head_dim():
    m = M.from_predicate(lambda b, h, q, k: k <= q + h, num_heads=3)
    got = m.materialize(4, 6).numpy()
    want = np.fromfunction(lambda h, q, k: k <= q + h, (3, 4, 6), dtype=int)[None]
    np.testing.assert_array_equal(got, want)
    both = (M.key_padding([2, 5]) & m).materialize(4, 6).numpy()  # (2,) & (1, 3) -> (2, 3)
    kp = np.arange(6)[None, None, None, :] < np.array([2, 5])[:, None, None, None]
    np.testing.assert_array_equal(both, kp & want)


def test_from_tensor_bool_and_float():
    g = torch.Generator().manual_seed(0)
    t = torch.rand((2, 1, 5, 7), generator=g) > 0.4
    np.testing.assert_array_equal(M.from_tensor(t).materialize(5, 7).numpy(), t.numpy())
    assert M.from_tensor(t).materialize_bias(5, 7) is None
    f = torch.randn((5, 7), dtype=torch.float64, generator=g)
    f[f < -0.5] = -math.inf
    m = M.from_tensor(f)
    assert m.has_bias
    np.testing.assert_array_equal(m.materialize(5, 7).numpy(), f.numpy() != -np.inf)
    bias = m.materialize_bias(5, 7).numpy()
    np.testing.assert_array_equal(bias, np.where(f.numpy() == -np.inf, 0.0, f.numpy()))


def test_from_key_padding_mask_and_from_additive():
    kpm = torch.tensor([[False, False, True, True], [False, True, False, False]])
    got = M.from_key_padding_mask(kpm).materialize(3, 4).numpy()
    np.testing.assert_array_equal(got, np.broadcast_to(~kpm.numpy()[:, None, :], (2, 3, 4)))
    fk = torch.tensor([[0.0, -math.inf, 0.5]], dtype=torch.float64)
    m = M.from_key_padding_mask(fk)
    np.testing.assert_array_equal(m.materialize(2, 3).numpy(), [[[1, 0, 1], [1, 0, 1]]])
    np.testing.assert_array_equal(m.materialize_bias(2, 3).numpy(), [[[0, 0, 0.5]] * 2])
    add = torch.tensor([[0.0, -math.inf], [0.5, 0.0]], dtype=torch.float64)
    m = M.from_additive(add)
    np.testing.assert_array_equal(m.materialize(2, 2).numpy(), add.numpy() != -np.inf)
    np.testing.assert_array_equal(m.materialize_bias(2, 2).numpy(), [[0, 0], [0.5, 0]])


@pytest.mark.parametrize("lq,lk", SIZES)
def test_alibi(lq, lk):
    i, j = ij(lq, lk)
    m = M.alibi(0.25)
    np.testing.assert_array_equal(m.materialize(lq, lk).numpy(), np.ones((lq, lk), bool))
    np.testing.assert_allclose(
        m.materialize_bias(lq, lk).numpy(), -0.25 * np.abs(j - (i + lk - lq)), rtol=0, atol=0
    )
    both = M.alibi(0.25) & M.alibi(1.0)
    np.testing.assert_allclose(
        both.materialize_bias(lq, lk).numpy(), -1.25 * np.abs(j - (i + lk - lq)), rtol=1e-15
    )


def test_alibi_slopes_follow_the_paper():
    np.testing.assert_allclose(M.alibi_slopes(8).numpy(), 2.0 ** -np.arange(1, 9), rtol=1e-15)
    s6 = M.alibi_slopes(6).numpy()  # 4 from the power of two, then every other one of 8
    np.testing.assert_allclose(s6, [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3], rtol=1e-15)


def test_and_or_combinations_with_batch_shapes():
    lq, lk = 9, 11
    i, j = ij(lq, lk)
    lengths = np.array([3, 11])
    kp = (np.arange(lk) < lengths[:, None])[:, None, :]  # (2, 1, Lk)
    ids = np.array([[0] * 4 + [1] * 5, [0] * 9])
    kv = np.array([[0] * 6 + [1] * 5, [0] * 5 + [1] * 6])
    doc = ids[:, :, None] == kv[:, None, :]
    win = np.abs(j - i) <= 2
    tri = j <= i
    cases = [
        (M.key_padding(lengths) & M.causal(), kp & tri),
        (M.key_padding(lengths) | M.sliding_window(2), kp | win),
        (M.document(ids, kv) & M.sliding_window(2), doc & win),
        (M.document(ids, kv) | M.key_padding(lengths), doc | kp),
        (
            (M.prefix_lm([1, 4]) & M.causal()) | M.sliding_window(1),
            ((j < np.array([1, 4])[:, None, None]) | tri) & tri | (np.abs(j - i) <= 1),
        ),
    ]
    for mask, want in cases:
        want = np.broadcast_to(want, (2, lq, lk))
        assert mask.batch_shape == (2,)
        np.testing.assert_array_equal(mask.materialize(lq, lk).numpy(), want, err_msg=repr(mask))
    a = M.alibi(0.5) & M.key_padding(lengths)
    bias = a.materialize_bias(lq, lk).numpy()
    np.testing.assert_allclose(bias, np.broadcast_to(-0.5 * np.abs(j - i - 2), (2, lq, lk)))


def test_tile_is_a_slice_of_materialize():
    m = (M.key_padding([5, 30]) & M.sliding_window(3, 7)) | M.prefix_lm([2, 0])
    full = m.materialize(29, 31)
    for q0, q1, k0, k1 in ((0, 29, 0, 31), (3, 4, 0, 31), (10, 29, 5, 9), (28, 29, 30, 31)):
        assert torch.equal(m.tile(q0, q1, k0, k1, 29, 31), full[..., q0:q1, k0:k1])


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
    if kind == "prefix":
        return M.prefix_lm(draw(small))
    if kind == "prefix_b":
        return M.prefix_lm(draw(st.lists(small, min_size=batch, max_size=batch)))
    if kind == "predicate":
        mod = draw(st.integers(2, 5))
        return M.from_predicate(lambda b, h, q, k: (q * 3 + k + b) % mod != 0, batch_size=batch)
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if kind == "tensor":
        return M.from_tensor(torch.rand((batch, 1, lq, lk), generator=g) > 0.3)
    if kind == "tensor_float":
        t = torch.randn((lq, lk), generator=g, dtype=torch.float64)
        return M.from_tensor(t.masked_fill(t < -0.8, -math.inf))
    if kind == "kpm":
        return M.from_key_padding_mask(torch.rand((batch, lk), generator=g) > 0.7)
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


def test_block_map_cache_is_bounded():
    m = M.sliding_window(1)
    for n in range(1, 100):
        m.block_map(n, n, 4, 4)
    assert len(m._cache()) <= 2 * M.BLOCK_MAP_CACHE_SIZE


# ---------------------------------------------------------------------------------------------
# docstring grids are right
# ---------------------------------------------------------------------------------------------
_INT_ROW = re.compile(r"^(?:\w+=\d+:\s*)?(-?\d+(?: +-?\d+)*)$")


def docstring_grids(obj) -> list[np.ndarray]:
    """Every integer grid in the literal blocks (after '::') of ``obj``'s docstring; grids side
    by side are told apart by their column position."""
    doc = inspect.getdoc(obj)
    grids: list[np.ndarray] = []
    lines = doc.splitlines()
    k = 0
    while k < len(lines):
        if not lines[k].rstrip().endswith("::"):
            k += 1
            continue
        k += 1
        starts: list[int] = []
        rows: dict[int, list[list[int]]] = {}
        while k < len(lines) and (not lines[k].strip() or lines[k].startswith("    ")):
            line = lines[k]
            k += 1
            groups = [
                (g.start(), g.group().strip()) for g in re.finditer(r"\S+(?: {1,2}\S+)*", line)
            ]
            parsed = [(col, _INT_ROW.match(text)) for col, text in groups]
            if not parsed or not all(p for _, p in parsed):
                continue  # blank line or a header such as "top_left   bottom_right"
            for col0, p in parsed:
                col = col0 + p.start(1)  # where the numbers start (after a "b=0:" label)
                if not starts or all(abs(col - s) > 3 for s in starts):
                    starts.append(col)
                s = min(starts, key=lambda x: abs(x - col))
                rows.setdefault(s, []).append([int(x) for x in p.group(1).split()])
        grids.extend(np.array(rows[s]) for s in sorted(rows))
    return grids


def _grid(m: M.Mask, lq: int, lk: int) -> list[np.ndarray]:
    t = m.materialize(lq, lk).numpy().astype(int)
    return [t] if t.ndim == 2 else list(t.reshape(-1, lq, lk))


DOC_GRIDS = [
    (M.causal, lambda: _grid(M.causal(), 3, 5) + _grid(M.causal("bottom_right"), 3, 5)),
    (
        M.sliding_window,
        lambda: _grid(M.sliding_window(1), 5, 5) + _grid(M.sliding_window(2, 0), 5, 5),
    ),
    (M.key_padding, lambda: _grid(M.key_padding([3, 1]), 2, 4)),
    (
        M.document,
        lambda: _grid(M.document([0, 0, 1, 1, 1]), 5, 5) + _grid(M.document([0, 1, 0]), 3, 3),
    ),
    (M.prefix_lm, lambda: _grid(M.prefix_lm(2), 4, 4)),
    (M.from_predicate, lambda: _grid(M.from_predicate(lambda b, h, q, k: (q + k) % 2 == 0), 3, 3)),
    (
        M.from_tensor,
        lambda: _grid(M.from_tensor(torch.tensor([[1, 0, 1], [0, 1, 1]]).bool()), 2, 3),
    ),
    (
        M.from_key_padding_mask,
        lambda: _grid(M.from_key_padding_mask(torch.tensor([[False, False, True]])), 2, 3),
    ),
    (
        M.from_additive,
        lambda: _grid(M.from_additive(torch.tensor([[0.0, -math.inf], [0.5, 0.0]])), 2, 2),
    ),
    (M.alibi, lambda: [M.alibi(1).materialize_bias(3, 4).numpy().astype(int)]),
]


@pytest.mark.parametrize("obj,expected", DOC_GRIDS, ids=[o.__name__ for o, _ in DOC_GRIDS])
def test_docstring_grids_match_the_masks(obj, expected):
    got = docstring_grids(obj)
    want = expected()
    assert len(got) == len(want), f"{obj.__name__}: {len(got)} grids in the docstring"
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=obj.__name__)


def test_every_public_mask_docstring_is_checked():
    checked = {o for o, _ in DOC_GRIDS}
    for name in M.__all__:
        obj = getattr(M, name)
        if inspect.isclass(obj) and issubclass(obj, M.Mask) and obj is not M.Mask:
            assert obj in checked, name
    assert M.from_key_padding_mask in checked and M.from_additive in checked


# ---------------------------------------------------------------------------------------------
# bad arguments name themselves
# ---------------------------------------------------------------------------------------------
def _not_bool(b, h, q, k):
    return q + k


BAD = [
    (lambda: M.causal("left"), ValueError, "alignment"),
    (lambda: M.sliding_window(-1), ValueError, "left"),
    (lambda: M.sliding_window(2, -1), ValueError, "right"),
    (lambda: M.sliding_window(1.5), ValueError, "left"),
    (lambda: M.sliding_window(True), ValueError, "left"),
    (lambda: M.sliding_window(2, alignment="middle"), ValueError, "alignment"),
    (lambda: M.key_padding([[1, 2]]), ValueError, "lengths"),
    (lambda: M.key_padding([1.5]), TypeError, "lengths"),
    (lambda: M.key_padding([-1, 2]), ValueError, "lengths"),
    (lambda: M.key_padding([]), ValueError, "lengths"),
    (lambda: M.key_padding("abc"), TypeError, "lengths"),
    (lambda: M.document([0.5, 1.0]), TypeError, "ids"),
    (lambda: M.document([[[0]]]), ValueError, "ids"),
    (lambda: M.document([[0, 1]], kv_ids=[0, 1]), ValueError, "kv_ids"),
    (lambda: M.document([0, 1]).materialize(3, 3), ValueError, "ids"),
    (lambda: M.prefix_lm(-1), ValueError, "prefix_len"),
    (lambda: M.prefix_lm(1.5), TypeError, "prefix_len"),
    (lambda: M.prefix_lm([[1]]), ValueError, "prefix_len"),
    (lambda: M.from_predicate(3), TypeError, "fn"),
    (lambda: M.from_predicate(_not_bool, batch_size=0), ValueError, "batch_size"),
    (lambda: M.from_predicate(_not_bool, num_heads=True), ValueError, "num_heads"),
    (lambda: M.from_predicate(_not_bool).materialize(2, 2), TypeError, "fn"),
    (
        lambda: M.from_predicate(lambda b, h, q, k: torch.ones(5, 1, 1, dtype=torch.bool), 2).tile(
            0, 2, 0, 2, 2, 2
        ),
        ValueError,
        "fn",
    ),
    (lambda: M.from_tensor([[True]]), TypeError, "mask"),
    (lambda: M.from_tensor(torch.ones(3, dtype=torch.bool)), ValueError, "mask"),
    (lambda: M.from_tensor(torch.ones(2, 2, dtype=torch.int64)), TypeError, "mask"),
    (
        lambda: M.from_tensor(torch.ones(2, 3, dtype=torch.bool)).materialize(3, 2),
        ValueError,
        "mask",
    ),
    (
        lambda: M.from_key_padding_mask(torch.ones(2, 3, 4, dtype=torch.bool)),
        ValueError,
        "key_padding_mask",
    ),
    (
        lambda: M.from_key_padding_mask(torch.ones(2, 3, dtype=torch.int32)),
        TypeError,
        "key_padding_mask",
    ),
    (lambda: M.from_key_padding_mask([[True]]), TypeError, "key_padding_mask"),
    (lambda: M.from_additive(torch.ones(2, 2, dtype=torch.bool)), TypeError, "m"),
    (lambda: M.alibi(float("nan")), ValueError, "slope"),
    (lambda: M.alibi("1"), ValueError, "slope"),
    (lambda: M.alibi_slopes(0), ValueError, "num_heads"),
    (lambda: M.causal().block_map(4, 4, 0, 2), ValueError, "block_q"),
    (lambda: M.causal().block_map(4, 4, 2, 1.5), ValueError, "block_kv"),
    (lambda: M.causal().materialize(0, 3), ValueError, "q_len"),
    (lambda: M.causal().materialize(3, -1), ValueError, "kv_len"),
    (lambda: M.causal() & 3, TypeError, "&"),
    (lambda: M.causal() | "x", TypeError, "|"),
    (lambda: M.alibi(1.0) | M.causal(), ValueError, "|"),
    (lambda: M.key_padding([1, 2]) & M.key_padding([1, 2, 3]), ValueError, "batch shapes"),
    (lambda: M.as_mask(3), TypeError, "mask"),
]


@pytest.mark.parametrize("make,exc,name", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_arguments_name_the_argument(make, exc, name):
    with pytest.raises(exc) as info:
        make()
    assert name in str(info.value), str(info.value)

"""attnkit.masks: every mask kind against a one-line NumPy construction, alignment, clamping
and the limits of what a mask can represent, the public structure (parts, leaves, bands) and
the mask normaliser. Block maps: tests/masks/test_block_maps.py; docstring grids and bad
arguments: tests/masks/test_mask_docs.py.

The oracles here are NumPy expressions, never the masks' own code paths.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from tests.support.block_maps import PARTIAL, ij, np_block_classes

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
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_prefix_lm_int_and_per_batch(lq, lk, alignment):
    i, j = ij(lq, lk)
    off = lk - lq if alignment == "bottom_right" else 0
    for p in (0, 2, lk, lk + 4):
        got = M.prefix_lm(p, alignment).materialize(lq, lk).numpy()
        np.testing.assert_array_equal(got, (j < p) | (j <= i + off))
    ps = np.array([0, 3, lk])
    got = M.prefix_lm(ps, alignment=alignment).materialize(lq, lk).numpy()
    np.testing.assert_array_equal(got, (j[None] < ps[:, None, None]) | (j <= i + off)[None])
    assert (
        M.prefix_lm(torch.tensor(3)).batch_shape == () and M.prefix_lm(np.int64(3)).prefix[0] == 3
    )


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


@pytest.mark.parametrize("lq,lk", SIZES)
def test_from_predicate_bottom_right_shifts_query_indices(lq, lk):
    m = M.from_predicate(lambda b, h, q, k: (k <= q) & ((q - k) % 3 != 2), alignment="bottom_right")
    i, j = ij(lq, lk)
    qi = i + lk - lq
    np.testing.assert_array_equal(m.materialize(lq, lk).numpy(), (j <= qi) & ((qi - j) % 3 != 2))


def test_from_predicate_using_heads_only_lines_up_with_the_head_dim():
    m = M.from_predicate(lambda b, h, q, k: k <= q + h, num_heads=3)
    got = m.materialize(4, 6).numpy()
    want = np.fromfunction(lambda h, q, k: k <= q + h, (3, 4, 6), dtype=int)[None]
    np.testing.assert_array_equal(got, want)
    both = (M.key_padding([2, 5]) & m).materialize(4, 6).numpy()  # (2,) & (1, 3) -> (2, 3)
    kp = np.arange(6)[None, None, None, :] < np.array([2, 5])[:, None, None, None]
    np.testing.assert_array_equal(both, kp & want)


@pytest.mark.parametrize("fn", [lambda i, j: i >= j, lambda b, h, q: q >= 0])
def test_from_predicate_refuses_a_function_without_four_arguments(fn):
    """A predicate of two indices (i, j) failed only when the mask was first used, with
    Python's own "<lambda>() takes 2 positional arguments but 4 were given"; it is refused when
    the mask is built, naming fn and the form it must take."""
    with pytest.raises(TypeError, match=r"fn: expected .*fn\(b, h, q_idx, kv_idx\)"):
        M.from_predicate(fn)


def test_from_predicate_takes_any_callable_that_accepts_four_arguments():
    def star(*idx):
        return idx[2] >= idx[3]

    got = M.from_predicate(star).materialize(3, 4).numpy()
    np.testing.assert_array_equal(got, np.tril(np.ones((3, 4), dtype=bool)))


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


@pytest.mark.parametrize("lq,lk", [(1, 1), (5, 9), (9, 5)])
def test_alibi_per_head_slopes_is_the_same_class(lq, lk):
    from attnkit.nn import ALiBiMask

    slopes = np.array([0.5, 0.25, 2.0**-5])
    m = M.ALiBi(torch.tensor(slopes))
    assert ALiBiMask is M.ALiBi and isinstance(M.alibi(1.0), M.ALiBi)
    assert m.batch_shape == (1, 3) and m.num_heads == 3 and m.slope is None
    i, j = ij(lq, lk)
    want = -slopes[:, None, None] * np.abs(j - (i + lk - lq))[None]
    np.testing.assert_array_equal(m.materialize_bias(lq, lk).numpy(), want[None])
    np.testing.assert_array_equal(m.materialize(lq, lk).numpy(), np.ones((1, 3, lq, lk), bool))
    # the allowed part is full, the public map partial (the bias must be applied): both ALiBi
    # spellings agree on block classes
    np.testing.assert_array_equal(m.block_map(lq, lk, 2, 3).numpy(), PARTIAL)
    np.testing.assert_array_equal(M.alibi(0.5).block_map(lq, lk, 2, 3).numpy(), PARTIAL)
    assert M.ALiBi([1.0, 2.0]).batch_shape == (1, 2)


def test_huge_alibi_slopes_saturate_instead_of_becoming_minus_inf():
    i, j = ij(3, 4)
    d = np.abs(j - (i + 1)).astype(np.float64)
    f64, f32 = np.finfo(np.float64).max, np.finfo(np.float32).max
    for slope in (1e300, 1e308, -1e308):
        m = M.alibi(slope)
        with np.errstate(over="ignore"):
            want64 = np.clip(-slope * d, -f64, f64)
        got = m.materialize_bias(3, 4).numpy()
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want64)
        got32 = m.materialize_bias(3, 4, dtype=torch.float32)
        assert got32.dtype == torch.float32 and bool(torch.isfinite(got32).all())
        np.testing.assert_array_equal(got32.numpy(), np.clip(want64, -f32, f32).astype(np.float32))
    # an ordinary bias is unchanged by the cast, -inf of a float mask is not a bias at all
    t = torch.tensor([[0.5, -math.inf], [-1e30, 0.0]], dtype=torch.float64)
    b = M.from_tensor(t).materialize_bias(2, 2, dtype=torch.float16)
    np.testing.assert_array_equal(b.numpy(), np.array([[0.5, 0], [-65504.0, 0]], np.float16))


@pytest.mark.parametrize("backend", ["auto", "math", "dense", "blocksparse"])
@pytest.mark.parametrize("lq,lk", [(3, 1), (2, 5), (7, 7)])
def test_huge_alibi_slope_in_float32_attention_matches_float64(backend, lq, lk):
    from attnkit import functional as F
    from attnkit import reference as R

    g = torch.Generator().manual_seed(lq * 10 + lk)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g) for n in (lq, lk, lk))
    i, j = ij(lq, lk)
    bias = np.maximum(-1e300 * np.abs(j - (i + lk - lq)), -np.finfo(np.float64).max)
    want = R.scaled_dot_product(q.double().numpy(), k.double().numpy(), v.double().numpy(), bias)
    got = F.scaled_dot_product_attention(q, k, v, M.alibi(1e300), backend=backend)
    assert bool(torch.isfinite(got).all())
    np.testing.assert_allclose(got.double().numpy(), np.asarray(want.output), rtol=1e-5, atol=1e-5)


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


def test_counts_beyond_the_sequence_are_clamped_to_lk():
    i, j = ij(4, 5)
    np.testing.assert_array_equal(
        M.key_padding([99, 2]).materialize(4, 5).numpy()[0], np.ones((4, 5))
    )
    np.testing.assert_array_equal(M.prefix_lm(99).materialize(4, 5).numpy(), np.ones((4, 5)))
    np.testing.assert_array_equal(
        M.prefix_lm(2**62, "bottom_right").materialize(4, 5).numpy(), np.ones((4, 5))
    )
    for m in (M.key_padding([2**62]), M.prefix_lm([2**62, 1])):
        np.testing.assert_array_equal(
            m.block_map(4, 5, 2, 2).numpy(), np_block_classes(m.materialize(4, 5).numpy(), 2, 2)
        )


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_windows_up_to_2_62_are_represented(alignment):
    i, j = ij(9, 7)
    off = 7 - 9 if alignment == "bottom_right" else 0
    for m, want in (
        (M.sliding_window(2**62, alignment=alignment), np.ones((9, 7), bool)),
        (M.sliding_window(2**62, 0, alignment=alignment), j <= i + off),
        (M.sliding_window(0, 2**62, alignment=alignment), j >= i + off),
    ):
        np.testing.assert_array_equal(m.materialize(9, 7).numpy(), want)
        np.testing.assert_array_equal(m.block_map(9, 7, 4, 3).numpy(), np_block_classes(want, 4, 3))
        band = (m & M.causal(alignment)).as_band()
        assert band is not None and band.hi == 0 and band.lo == m.lo


def test_public_structure_and_names():
    c, w, kp = M.causal(), M.sliding_window(3, 0, "bottom_right"), M.key_padding([2, 3])
    both = (c & kp) & w
    assert isinstance(both, M.Intersection) and both.parts == (both.a, both.b)
    assert both.parts[1] is w and both.leaves() == (c, kp, w) and c.leaves() == (c,)
    assert isinstance(c | kp, M.Union) and (c | kp).parts == (c, kp)
    assert c.as_band() is c and kp.as_band() is None and (c & kp).as_band() is None
    band = (M.causal("bottom_right") & w).as_band()
    assert (band.lo, band.hi, band.alignment) == (-3, 0, "bottom_right")
    assert band.offset(3, 8) == 5 and c.as_band().offset(3, 8) == 0
    assert (c & M.causal("bottom_right")).as_band() is None  # two alignments: not one band
    assert c.is_plain_causal and not M.causal("bottom_right").is_plain_causal
    assert not (c & kp).is_plain_causal and not M.sliding_window(9, 0).is_plain_causal
    assert [m.alignment for m in (c, w, kp, M.prefix_lm(1, "bottom_right"), M.alibi(1.0))] == [
        "top_left",
        "bottom_right",
        None,
        "bottom_right",
        "bottom_right",
    ]
    pairs = [
        (M.causal, M.Causal),
        (M.sliding_window, M.SlidingWindow),
        (M.key_padding, M.KeyPadding),
        (M.document, M.Document),
        (M.prefix_lm, M.PrefixLM),
        (M.from_predicate, M.Predicate),
        (M.from_tensor, M.TensorMask),
        (M._And, M.Intersection),
        (M._Or, M.Union),
        (M._Band, M.Band),
    ]
    assert all(a is b for a, b in pairs)
    assert c._band() is c and both._band() is None  # the private names kernels used still work


@pytest.mark.parametrize(
    "shape", [(5, 7), (1, 7), (2, 1, 5, 7), (1, 3, 1, 1), (1, 1, 1, 5, 1), (2, 3, 5, 7)]
)
def test_normalize_right_aligns_tensors_like_torch(shape):
    g = torch.Generator().manual_seed(sum(shape))
    t = torch.rand(shape, generator=g) > 0.5
    batch = (1, 2, 3) if len(shape) == 5 else (2, 3)
    m = M.normalize(t, batch, 5, 7)
    got = m.materialize(5, 7).numpy()
    want = np.broadcast_to(t.numpy(), batch + (5, 7))
    np.testing.assert_array_equal(np.broadcast_to(got, want.shape), want)
    kp = M.key_padding([1, 7])
    assert M.normalize(kp, (2, 3), 5, 7) is kp and M.normalize(None, (2,), 5, 7) is None


def test_biases_of_an_intersection_add_up_exactly():
    """Two float32 bias tensors combined with ``&`` were added in float32 before the cast to
    the call's dtype: float64 calls on blocksparse and additive_chunked were off by 1e-7 (the
    float32 rounding of the sum) while math and dense were exact. The sum is exact in float64;
    outputs against torch math in float64 with the sum made there, 1e-12."""
    g = torch.Generator().manual_seed(0)
    n = 70
    a, b = (torch.randn(n, n, generator=g) for _ in range(2))
    exact = a.double() + b.double()
    both = M.from_tensor(a) & M.from_tensor(b)
    assert torch.equal(both.materialize_bias(n, n, torch.float64), exact)
    mask = both & M.causal()
    q, k, v = (torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64) for _ in range(3))
    s = (q @ k.transpose(-1, -2) / 8**0.5 + exact).masked_fill(
        ~M.causal().materialize(n, n), -np.inf
    )
    want = torch.softmax(s, -1) @ v
    got = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    w_q, w_k = (torch.randn(4, 8, generator=g, dtype=torch.float64) for _ in range(2))
    w_v = torch.randn(4, generator=g, dtype=torch.float64)
    e = torch.tanh((q @ w_q.T).unsqueeze(-2) + (k @ w_k.T).unsqueeze(-3)) @ w_v + exact
    want = torch.softmax(e.masked_fill(~M.causal().materialize(n, n), -np.inf), -1) @ v
    got = F.additive_attention(q, k, v, w_q, w_k, w_v, mask, backend="additive_chunked")
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)

"""attnkit.reference.dot_product_attention (scaled and unscaled) and the shared steps (softmax
rows, masks) against the hand loop, identities and seed 004's worked examples.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnkit import reference as R
from tests.reference.hand_loop import (
    REL,
    SEED004,
    SHAPES,
    dot,
    hand_attention,
    per_batch,
    random_mask,
    softmax_pair,
)
from tests.support.numerics import rel_err


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_scaled_dot_product_matches_hand_loop(shape, mask_kind):
    batch, lq, lk, dk, dv = shape
    rng = np.random.default_rng(1)
    Q, K, V = (rng.normal(size=batch + s) for s in ((lq, dk), (lk, dk), (lk, dv)))
    M = random_mask(rng, batch + (lq, lk), mask_kind)
    t = R.scaled_dot_product(Q, K, V, mask=M)
    assert t.output.shape == batch + (lq, dv) and t.weights.shape == batch + (lq, lk)
    for idx, (q, k, v) in per_batch((Q, K, V), batch):
        m = None if M is None else M[idx]
        w, out = hand_attention(
            lambda i, j, q=q, k=k: dot(q[i], k[j]), lq, lk, v, 1 / math.sqrt(dk), m
        )
        assert rel_err(t.weights[idx], w) <= REL
        assert rel_err(t.output[idx], out) <= REL
        for i in range(lq):
            for j in range(lk):
                assert math.isclose(
                    t.scores[idx][i, j], dot(q[i], k[j]), rel_tol=1e-12, abs_tol=1e-12
                )
                assert math.isclose(t.scaled[idx][i, j], t.scores[idx][i, j] / math.sqrt(dk))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_softmax_rows_sum_to_one_and_are_nonnegative(shape):
    batch, lq, lk, dk, dv = shape
    rng = np.random.default_rng(4)
    Q, K, V = (rng.normal(size=batch + s) * 3 for s in ((lq, dk), (lk, dk), (lk, dv)))
    for M in (None, random_mask(rng, batch + (lq, lk), "bool")):
        t = R.scaled_dot_product(Q, K, V, mask=M)
        has_key = t.allowed.any(axis=-1)
        sums = t.weights.sum(axis=-1)
        assert np.all(t.weights >= 0)
        assert np.allclose(sums[has_key], 1.0, rtol=0, atol=1e-14)
        assert np.all(sums[~has_key] == 0)
        assert np.all(t.weights[~t.allowed] == 0)


def test_scaled_equals_dot_product_on_prescaled_queries():
    rng = np.random.default_rng(5)
    Q, K, V = rng.normal(size=(2, 7, 6)), rng.normal(size=(2, 11, 6)), rng.normal(size=(2, 11, 3))
    M = random_mask(rng, (7, 11), "float")
    for scale in (None, 0.25, 3.0):
        s = 1 / math.sqrt(6) if scale is None else scale
        a = R.scaled_dot_product(Q, K, V, mask=M, scale=scale)
        b = R.dot_product(Q * s, K, V, mask=M)
        assert a.scale == s and b.scale == 1.0
        assert rel_err(a.output, b.output) <= 1e-14
        assert rel_err(a.weights, b.weights) <= 1e-14


def test_fully_masked_rows_give_zero_weights_and_output():
    rng = np.random.default_rng(10)
    Q, K, V = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 6, 3)), rng.normal(size=(2, 6, 5))
    allowed = rng.random((2, 4, 6)) < 0.5
    allowed[0, 1] = False  # a fully masked row in batch 0
    allowed[1] = False  # batch 1 fully masked
    M = np.where(allowed, 0.0, -np.inf)
    for mask in (allowed, M):
        for fn in (R.scaled_dot_product, R.dot_product):
            t = fn(Q, K, V, mask=mask)
            assert np.all(np.isfinite(t.weights)) and np.all(np.isfinite(t.output))
            assert np.all(t.weights[0, 1] == 0) and np.all(t.output[0, 1] == 0)
            assert np.all(t.weights[1] == 0) and np.all(t.output[1] == 0)
            assert np.allclose(t.weights[0, [0, 2, 3]].sum(-1), 1.0)


def test_float_mask_of_zero_and_minus_inf_equals_bool_mask():
    rng = np.random.default_rng(11)
    Q, K, V = rng.normal(size=(7, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    allowed = rng.random((7, 5)) < 0.5
    a = R.scaled_dot_product(Q, K, V, mask=allowed)
    b = R.scaled_dot_product(Q, K, V, mask=np.where(allowed, 0.0, -np.inf))
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.allowed, b.allowed)
    # seed 001's "very large negative number" approximates -inf where some key is allowed
    c = R.scaled_dot_product(Q, K, V, mask=np.where(allowed, 0.0, -1e9))
    rows = allowed.any(-1)
    assert rel_err(c.output[rows], a.output[rows]) <= 1e-14


def test_mask_broadcasts_right_aligned():
    rng = np.random.default_rng(12)
    Q, K, V = (
        rng.normal(size=(2, 3, 4, 5)),
        rng.normal(size=(2, 3, 6, 5)),
        rng.normal(size=(2, 3, 6, 2)),
    )
    m = rng.random((3, 1, 6)) < 0.5  # per head, same for every query
    t = R.scaled_dot_product(Q, K, V, mask=m)
    full = np.broadcast_to(m, (2, 3, 4, 6))
    u = R.scaled_dot_product(Q, K, V, mask=full)
    np.testing.assert_array_equal(t.output, u.output)
    np.testing.assert_array_equal(t.allowed, full)


def test_seed004_scaled_dot_product():
    Q, K, V = SEED004["Q"], SEED004["K"], SEED004["V"]
    t = R.scaled_dot_product(Q, K, V)
    for i in range(2):
        e = [(Q[i, 0] * K[j, 0] + Q[i, 1] * K[j, 1]) / np.sqrt(2.0) for j in range(2)]
        a = softmax_pair(*e)
        out = a[0] * V[0] + a[1] * V[1]
        np.testing.assert_allclose(t.scaled[i], e, rtol=1e-15)
        np.testing.assert_allclose(t.weights[i], a, rtol=1e-14)
        np.testing.assert_allclose(t.output[i], out, rtol=1e-14)


def test_seed004_unscaled_dot_product():
    Q, K, V = SEED004["Q"], SEED004["K"], SEED004["V"]
    t = R.dot_product(Q, K, V)
    for i in range(2):
        e = [Q[i, 0] * K[j, 0] + Q[i, 1] * K[j, 1] for j in range(2)]
        a = softmax_pair(*e)
        np.testing.assert_allclose(t.scores[i], e, rtol=1e-15)
        np.testing.assert_allclose(t.weights[i], a, rtol=1e-14)
        np.testing.assert_allclose(t.output[i], a[0] * V[0] + a[1] * V[1], rtol=1e-14)


@pytest.mark.parametrize("big", [1e160, -1e160])
def test_scores_beyond_float64_are_refused_not_zeroed(big):
    """Finite Q, K whose scores overflow float64 (|q.k| ~ 1e320): the softmax read the +inf
    (or inf - inf = NaN) row as a row without keys and returned output 0 for it, which is not
    attention's result; the reference refuses them, naming Q and K. Scores that stay in range
    (1e150) still give the one-hot limit: the value of the key with the largest score."""
    q = np.array([[1.0, 1.0], [0.0, 0.0]])
    k = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 0.5]])
    v = np.array([[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match=r"Q, K: expected scores within float64's range"):
        R.scaled_dot_product(q * big, k * abs(big), v)
    with pytest.raises(ValueError, match=r"Q, K"):
        R.scaled_dot_product_sinks(q[None] * big, k[None] * abs(big), v[None], sinks=np.zeros(1))
    out = R.scaled_dot_product(q * 1e150, k * 1e150, v).output
    np.testing.assert_allclose(out, [[1.0], [2.0]], atol=1e-12)

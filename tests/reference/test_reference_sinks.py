"""The float64 reference's softcapping and sinks (``reference.scaled_dot_product_sinks``)
against independent computations: plain scaled dot-product attention with an extra key column
(a sink is a key whose logit is the sink in every row and whose value is 0), the cap written out
per entry with math.tanh, and the fully-masked-row rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnkit import reference as R

RNG = np.random.default_rng(0)


def test_without_cap_and_sinks_it_is_scaled_dot_product():
    q, k, v = (
        RNG.normal(size=(2, 3, 5, 4)),
        RNG.normal(size=(2, 3, 7, 4)),
        RNG.normal(size=(2, 3, 7, 2)),
    )
    mask = RNG.random((5, 7)) < 0.7
    a, b = R.scaled_dot_product_sinks(q, k, v, mask), R.scaled_dot_product(q, k, v, mask)
    np.testing.assert_allclose(a.output, b.output, rtol=0, atol=1e-15)
    np.testing.assert_allclose(a.sink_weights, 0.0)


def test_a_sink_is_an_extra_key_with_value_zero():
    q, k, v = (
        RNG.normal(size=(2, 3, 5, 4)),
        RNG.normal(size=(2, 3, 7, 4)),
        RNG.normal(size=(2, 3, 7, 2)),
    )
    sinks = RNG.normal(size=3) * 3
    mask = RNG.random((5, 7)) < 0.6
    t = R.scaled_dot_product_sinks(q, k, v, mask, sinks=sinks)
    kx = np.concatenate([k, np.zeros((2, 3, 1, 4))], -2)
    vx = np.concatenate([v, np.zeros((2, 3, 1, 2))], -2)
    bias = np.where(mask, 0.0, -np.inf)
    bias = np.concatenate(
        [np.broadcast_to(bias, (3, 5, 7)), np.broadcast_to(sinks[:, None, None], (3, 5, 1))], -1
    )
    want = R.scaled_dot_product(q, kx, vx, bias)
    np.testing.assert_allclose(t.output, want.output, rtol=0, atol=1e-14)
    np.testing.assert_allclose(t.weights, want.weights[..., :-1], rtol=0, atol=1e-15)
    np.testing.assert_allclose(t.sink_weights, want.weights[..., -1:], rtol=0, atol=1e-15)


def test_the_cap_comes_before_the_bias():
    q, k, v = (
        RNG.normal(size=(1, 2, 3)) * 4,
        RNG.normal(size=(1, 4, 3)) * 4,
        RNG.normal(size=(1, 4, 2)),
    )
    bias = RNG.normal(size=(2, 4)) * 10
    t = R.scaled_dot_product_sinks(q, k, v, bias, scale=0.5, softcap=2.0)
    for i in range(2):
        for j in range(4):
            s = 0.5 * sum(q[0, i, c] * k[0, j, c] for c in range(3))
            assert math.isclose(t.capped[0, i, j], 2.0 * math.tanh(s / 2.0), abs_tol=1e-14)
            assert math.isclose(
                t.masked[0, i, j], 2.0 * math.tanh(s / 2.0) + bias[i, j], abs_tol=1e-13
            )
    assert np.abs(t.capped).max() < 2.0


def test_a_fully_masked_row_puts_all_weight_on_the_sink():
    q = RNG.normal(size=(2, 4, 3))
    mask = np.ones((4, 4), bool)
    mask[2] = False
    t = R.scaled_dot_product_sinks(q, q, q, mask, sinks=np.array([0.3, -5.0]))
    assert (t.weights[:, 2] == 0).all() and (t.output[:, 2] == 0).all()
    np.testing.assert_allclose(t.sink_weights[:, 2], 1.0)
    assert (t.sink_weights[:, [0, 1, 3]] < 1).all()


def test_bad_arguments_name_themselves():
    q = RNG.normal(size=(2, 4, 3))
    with pytest.raises(ValueError, match=r"sinks: expected shape \(H,\)"):
        R.scaled_dot_product_sinks(q, q, q, sinks=np.zeros(3))
    with pytest.raises(ValueError, match="softcap: expected a positive"):
        R.scaled_dot_product_sinks(q, q, q, softcap=0)
    with pytest.raises(ValueError, match="sinks: expected finite"):
        R.scaled_dot_product_sinks(q, q, q, sinks=np.array([0.0, np.nan]))

"""attnkit.reference.additive_general (additive, general) against the hand loop and seed 004's
worked example.
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
def test_additive_matches_hand_loop(shape, mask_kind):
    batch, lq, lk, dk, dv = shape
    dq, h = dk + 1, 3
    rng = np.random.default_rng(2)
    Q, K, V = (rng.normal(size=batch + s) for s in ((lq, dq), (lk, dk), (lk, dv)))
    W_q, W_k, w_v = rng.normal(size=(h, dq)), rng.normal(size=(h, dk)), rng.normal(size=h)
    M = random_mask(rng, batch + (lq, lk), mask_kind)
    t = R.additive(Q, K, V, W_q, W_k, w_v, mask=M)
    assert t.scale == 1.0 and t.hidden.shape == batch + (lq, lk, h)
    for idx, (q, k, v) in per_batch((Q, K, V), batch):

        def e(i, j, q=q, k=k):  # e_ij = v^T tanh(W_q q_i + W_k k_j), seed 004
            return sum(w_v[r] * math.tanh(dot(W_q[r], q[i]) + dot(W_k[r], k[j])) for r in range(h))

        m = None if M is None else M[idx]
        w, out = hand_attention(e, lq, lk, v, 1.0, m)
        assert rel_err(t.weights[idx], w) <= REL
        assert rel_err(t.output[idx], out) <= REL
        assert rel_err(t.scores[idx], [[e(i, j) for j in range(lk)] for i in range(lq)]) <= REL


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_general_matches_hand_loop(shape):
    batch, lq, lk, dk, dv = shape
    dq = dk + 2
    rng = np.random.default_rng(3)
    Q, K, V = (rng.normal(size=batch + s) for s in ((lq, dq), (lk, dk), (lk, dv)))
    W = rng.normal(size=(dq, dk))
    M = random_mask(rng, (lq, lk), "bool")  # broadcast over the batch
    t = R.general(Q, K, V, W, mask=M)
    for idx, (q, k, v) in per_batch((Q, K, V), batch):

        def e(i, j, q=q, k=k):  # q_i W k_j^T
            return sum(q[i][a] * W[a][b] * k[j][b] for a in range(dq) for b in range(dk))

        w, out = hand_attention(e, lq, lk, v, 1.0, M)
        assert rel_err(t.weights[idx], w) <= REL
        assert rel_err(t.output[idx], out) <= REL


def test_seed004_additive_with_identity_weights():
    Q, K, V = SEED004["Q"], SEED004["K"], SEED004["V"]
    eye, v = np.eye(2), np.array([1.0, 1.0])
    t = R.additive(Q, K, V, eye, eye, v)
    for i in range(2):
        # e_ij = v^T tanh(W_q Q_i + W_k K_j) with W_q = W_k = I
        e = [np.tanh(Q[i, 0] + K[j, 0]) + np.tanh(Q[i, 1] + K[j, 1]) for j in range(2)]
        a = softmax_pair(*e)
        np.testing.assert_allclose(t.scores[i], e, rtol=1e-15)
        np.testing.assert_allclose(t.weights[i], a, rtol=1e-14)
        np.testing.assert_allclose(t.output[i], a[0] * V[0] + a[1] * V[1], rtol=1e-14)

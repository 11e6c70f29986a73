"""attnkit.reference.projected_attention (self_attention, multi_head) against scaled dot-product
attention of the projections, seed 000's word-by-word computation and a per-head loop.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnkit import reference as R
from tests.reference.hand_loop import REL, dot, hand_attention, per_batch
from tests.support.numerics import rel_err


def test_self_attention_is_scaled_dot_product_on_projections():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(2, 9, 8))
    W_q, W_k, W_v = rng.normal(size=(8, 5)), rng.normal(size=(8, 5)), rng.normal(size=(8, 3))
    M = np.tril(np.ones((9, 9), dtype=bool))
    t = R.self_attention(X, W_q, W_k, W_v, mask=M)
    ref = R.scaled_dot_product(X @ W_q, X @ W_k, X @ W_v, mask=M)
    assert isinstance(t, R.SelfAttentionTrace) and np.array_equal(t.x, X)
    for f in ("q", "k", "v", "scores", "weights", "output"):
        assert rel_err(getattr(t, f), getattr(ref, f)) <= 1e-15


def test_seed000_one_word_equals_matrix_form():
    """Seed 000: the output for "on" computed word by word equals row 4 of the matrix form."""
    rng = np.random.default_rng(7)
    words = ["humpty", "dumpty", "sat", "on"]
    d = 16
    X = rng.normal(size=(len(words), d))
    W_q, W_k, W_v = (rng.normal(size=(d, d)) / math.sqrt(d) for _ in range(3))
    t = R.self_attention(X, W_q, W_k, W_v)
    # section 2: Q_x = E_x W^Q etc., one word at a time
    Qw = {
        w: [sum(X[r][n] * W_q[n][c] for n in range(d)) for c in range(d)]
        for r, w in enumerate(words)
    }
    Kw = {
        w: [sum(X[r][n] * W_k[n][c] for n in range(d)) for c in range(d)]
        for r, w in enumerate(words)
    }
    Vw = {
        w: [sum(X[r][n] * W_v[n][c] for n in range(d)) for c in range(d)]
        for r, w in enumerate(words)
    }
    # section 3.1: AttentionScore_on = [Q_on . K_x / sqrt(d_k)]
    score = {x: dot(Qw["on"], Kw[x]) / math.sqrt(d) for x in words}
    # section 3.2: softmax
    total = sum(math.exp(s) for s in score.values())
    weight = {x: math.exp(score[x]) / total for x in words}
    # section 3.3: weighted sum of the value vectors
    out_on = [sum(weight[x] * Vw[x][c] for x in words) for c in range(d)]
    assert math.isclose(sum(weight.values()), 1.0, rel_tol=1e-15)
    assert rel_err(t.weights[3], [weight[x] for x in words]) <= REL
    assert rel_err(t.output[3], out_on) <= REL
    assert rel_err(t.q[3], Qw["on"]) <= REL


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=str)
def test_multi_head_equals_per_head_loop(batch):
    rng = np.random.default_rng(8)
    H, d_model, d_kv, dk, dv, d_out, lq, lk = 3, 7, 5, 4, 2, 6, 5, 9
    Xq, Xkv = rng.normal(size=batch + (lq, d_model)), rng.normal(size=batch + (lk, d_kv))
    W_q, W_k = rng.normal(size=(d_model, H * dk)), rng.normal(size=(d_kv, H * dk))
    W_v, W_o = rng.normal(size=(d_kv, H * dv)), rng.normal(size=(H * dv, d_out))
    M = rng.random((H, lq, lk)) < 0.6  # a different mask per head
    t = R.multi_head(Xq, Xkv, W_q, W_k, W_v, W_o, H, mask=M)
    assert isinstance(t, R.MultiHeadTrace) and len(t.heads) == H
    assert t.weights.shape == batch + (H, lq, lk) and t.output.shape == batch + (lq, d_out)
    for idx, (xq, xkv) in per_batch((Xq, Xkv), batch):
        concat = []
        for i in range(H):
            q = xq @ W_q[:, i * dk : (i + 1) * dk]
            k = xkv @ W_k[:, i * dk : (i + 1) * dk]
            v = xkv @ W_v[:, i * dv : (i + 1) * dv]
            w, out = hand_attention(
                lambda a, b, q=q, k=k: dot(q[a], k[b]), lq, lk, v, dk**-0.5, M[i]
            )
            assert rel_err(t.weights[idx][i], w) <= REL
            assert rel_err(t.heads[i].output[idx], out) <= REL
            concat.append(out)
        concat = np.concatenate(concat, axis=-1)
        assert rel_err(t.concat[idx], concat) <= REL
        final = [[dot(concat[r], W_o[:, c]) for c in range(d_out)] for r in range(lq)]
        assert rel_err(t.output[idx], final) <= REL


def test_multi_head_with_one_head_is_self_attention_times_w_o():
    rng = np.random.default_rng(9)
    X = rng.normal(size=(6, 4))
    W_q, W_k, W_v, W_o = (rng.normal(size=s) for s in ((4, 3), (4, 3), (4, 5), (5, 2)))
    t = R.multi_head(X, X, W_q, W_k, W_v, W_o, 1)
    s = R.self_attention(X, W_q, W_k, W_v)
    assert rel_err(t.output, s.output @ W_o) <= 1e-14

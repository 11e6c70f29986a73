"""attnkit.reference against independent constructions.

The oracle is vectorised NumPy; here it is checked against explicit Python loops that follow the
seeds' per-word computation (seed 000 section 3: one query, its score against every key, the
softmax, the weighted sum of the values), against algebraic identities, and against seed 004's
worked examples recomputed from the formulas. Expected values are always computed in the test,
never copied from the seeds' text or from the library's output.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnkit import reference as R

REL = 1e-12  # vectorised float64 vs Python loops: only the summation order differs


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ---------------------------------------------------------------------------------------------
# the hand loop: one query at a time, as in seed 000 section 3
# ---------------------------------------------------------------------------------------------
def hand_attention(score, n_q, n_k, V, scale=1.0, mask=None):
    """For every query i: s_ij = score(i, j) * scale (+ M_ij), alpha_i = softmax over allowed
    j, output_i = sum_j alpha_ij V_j. ``mask`` is None or an (n_q, n_k) bool/float array.
    Returns (weights, output) as nested float lists turned into arrays."""
    d_v = len(V[0])
    weights = [[0.0] * n_k for _ in range(n_q)]
    output = [[0.0] * d_v for _ in range(n_q)]
    for i in range(n_q):
        row = {}
        for j in range(n_k):
            s = score(i, j) * scale
            if mask is not None:
                m = mask[i][j]
                if isinstance(m, (bool, np.bool_)):
                    if not m:
                        continue
                elif m == -math.inf:
                    continue
                else:
                    s += float(m)
            row[j] = s
        if not row:
            continue  # no allowed key: weights 0, output 0
        top = max(row.values())
        exps = {j: math.exp(s - top) for j, s in row.items()}
        total = sum(exps.values())
        for j, e in exps.items():
            weights[i][j] = e / total
        for c in range(d_v):
            output[i][c] = sum(weights[i][j] * V[j][c] for j in range(n_k))
    return np.array(weights), np.array(output)


def dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def per_batch(arrays, batch):
    """Yield (index, [a[index] for a in arrays]) over every batch element."""
    for idx in np.ndindex(*batch):
        yield idx, [a[idx] for a in arrays]


def random_mask(rng, shape, kind):
    if kind is None:
        return None
    allowed = rng.random(shape) < 0.7
    if kind == "bool":
        return allowed
    return np.where(allowed, rng.normal(size=shape), -np.inf)  # seed 001's M


SHAPES = [  # batch, Lq, Lk, d_k, d_v
    ((), 1, 1, 1, 1),
    ((), 7, 5, 3, 2),
    ((2, 3), 7, 5, 4, 3),
    ((3,), 9, 13, 2, 5),
]


# ---------------------------------------------------------------------------------------------
# score kinds vs the hand loop
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# identities
# ---------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("n,d", [(1, 1), (1, 4), (7, 5), (50, 16), (9, 33)])
def test_sinusoidal_positions_matches_loop(n, d):
    pe = R.sinusoidal_positions(n, d).output
    assert pe.shape == (n, d)
    expected = np.zeros((n, d))
    for pos in range(n):
        for i in range((d + 1) // 2):
            angle = pos / 10000 ** (2 * i / d)
            expected[pos, 2 * i] = math.sin(angle)
            if 2 * i + 1 < d:
                expected[pos, 2 * i + 1] = math.cos(angle)
    np.testing.assert_allclose(pe, expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# seed 004's worked examples, recomputed from the formulas
# ---------------------------------------------------------------------------------------------
SEED004 = dict(
    Q=np.array([[1.0, 0.0], [0.0, 1.0]]),
    K=np.array([[1.0, 2.0], [3.0, 4.0]]),
    V=np.array([[5.0, 6.0], [7.0, 8.0]]),
)


def _softmax_pair(e1: float, e2: float) -> tuple[float, float]:
    a1 = np.exp(e1) / (np.exp(e1) + np.exp(e2))
    a2 = np.exp(e2) / (np.exp(e1) + np.exp(e2))
    return a1, a2


def test_seed004_scaled_dot_product():
    Q, K, V = SEED004["Q"], SEED004["K"], SEED004["V"]
    t = R.scaled_dot_product(Q, K, V)
    for i in range(2):
        e = [(Q[i, 0] * K[j, 0] + Q[i, 1] * K[j, 1]) / np.sqrt(2.0) for j in range(2)]
        a = _softmax_pair(*e)
        out = a[0] * V[0] + a[1] * V[1]
        np.testing.assert_allclose(t.scaled[i], e, rtol=1e-15)
        np.testing.assert_allclose(t.weights[i], a, rtol=1e-14)
        np.testing.assert_allclose(t.output[i], out, rtol=1e-14)


def test_seed004_unscaled_dot_product():
    Q, K, V = SEED004["Q"], SEED004["K"], SEED004["V"]
    t = R.dot_product(Q, K, V)
    for i in range(2):
        e = [Q[i, 0] * K[j, 0] + Q[i, 1] * K[j, 1] for j in range(2)]
        a = _softmax_pair(*e)
        np.testing.assert_allclose(t.scores[i], e, rtol=1e-15)
        np.testing.assert_allclose(t.weights[i], a, rtol=1e-14)
        np.testing.assert_allclose(t.output[i], a[0] * V[0] + a[1] * V[1], rtol=1e-14)


def test_seed004_additive_with_identity_weights():
    Q, K, V = SEED004["Q"], SEED004["K"], SEED004["V"]
    eye, v = np.eye(2), np.array([1.0, 1.0])
    t = R.additive(Q, K, V, eye, eye, v)
    for i in range(2):
        # e_ij = v^T tanh(W_q Q_i + W_k K_j) with W_q = W_k = I
        e = [np.tanh(Q[i, 0] + K[j, 0]) + np.tanh(Q[i, 1] + K[j, 1]) for j in range(2)]
        a = _softmax_pair(*e)
        np.testing.assert_allclose(t.scores[i], e, rtol=1e-15)
        np.testing.assert_allclose(t.weights[i], a, rtol=1e-14)
        np.testing.assert_allclose(t.output[i], a[0] * V[0] + a[1] * V[1], rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# traces, dependencies
# ---------------------------------------------------------------------------------------------
def test_traces_are_frozen_and_read_only():
    rng = np.random.default_rng(13)
    Q = rng.normal(size=(3, 2))
    t = R.scaled_dot_product(Q, Q, Q)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.output = None  # type: ignore[misc]
    with pytest.raises(ValueError):
        t.weights[0, 0] = 1.0
    Q[0, 0] = 100.0  # the trace holds a copy of the input
    assert t.q[0, 0] != 100.0
    p = R.sinusoidal_positions(3, 4)
    with pytest.raises(ValueError):
        p.output[0, 0] = 1.0


def test_reference_does_not_import_torch():
    path = Path(R.__file__)
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ref', {str(path)!r})\n"
        "mod = importlib.util.module_from_spec(spec); sys.modules['ref'] = mod\n"
        "spec.loader.exec_module(mod)\n"
        "mod.scaled_dot_product([[1.0]], [[1.0]], [[1.0]])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    assert importlib.util.find_spec("numpy") is not None
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# bad input: exception type and the offending argument named first in the message
# ---------------------------------------------------------------------------------------------
_g = np.random.default_rng(14)
q3, k5, v5 = _g.normal(size=(3, 4)), _g.normal(size=(5, 4)), _g.normal(size=(5, 2))
X, W44, W42 = _g.normal(size=(5, 4)), _g.normal(size=(4, 4)), _g.normal(size=(4, 2))
MH = dict(X_q=X, X_kv=X, W_q=W44, W_k=W44, W_v=W44, W_o=_g.normal(size=(4, 3)), num_heads=2)


def _mh(**kw):
    return lambda: R.multi_head(**{**MH, **kw})


BAD = [
    ("Q rank 1", lambda: R.scaled_dot_product(q3[0], k5, v5), ValueError, "Q"),
    ("Q strings", lambda: R.scaled_dot_product([["a"]], k5, v5), TypeError, "Q"),
    ("Q None", lambda: R.scaled_dot_product(None, k5, v5), TypeError, "Q"),
    ("Q bool", lambda: R.scaled_dot_product(q3 > 0, k5, v5), TypeError, "Q"),
    ("Q complex", lambda: R.scaled_dot_product(q3 + 1j, k5, v5), TypeError, "Q"),
    ("Q NaN", lambda: R.scaled_dot_product(q3 * np.nan, k5, v5), ValueError, "Q"),
    ("Q empty", lambda: R.scaled_dot_product(np.zeros((0, 4)), k5, v5), ValueError, "Q"),
    ("K inf", lambda: R.scaled_dot_product(q3, k5 * np.inf, v5), ValueError, "K"),
    ("K width", lambda: R.scaled_dot_product(q3, k5[:, :3], v5), ValueError, "K"),
    ("K batch", lambda: R.scaled_dot_product(q3, k5[None], v5), ValueError, "K"),
    ("V batch", lambda: R.scaled_dot_product(q3, k5, np.stack([v5, v5])), ValueError, "V"),
    ("V rows", lambda: R.scaled_dot_product(q3, k5, v5[:4]), ValueError, "V"),
    ("mask int", lambda: R.scaled_dot_product(q3, k5, v5, np.ones((3, 5), int)), TypeError, "mask"),
    ("mask str", lambda: R.scaled_dot_product(q3, k5, v5, "causal"), TypeError, "mask"),
    (
        "mask shape",
        lambda: R.scaled_dot_product(q3, k5, v5, np.ones((5, 3), bool)),
        ValueError,
        "mask",
    ),
    ("mask rank 1", lambda: R.scaled_dot_product(q3, k5, v5, np.ones(5, bool)), ValueError, "mask"),
    (
        "mask too many dims",
        lambda: R.dot_product(q3, k5, v5, np.ones((2, 3, 5), bool)),
        ValueError,
        "mask",
    ),
    ("mask NaN", lambda: R.dot_product(q3, k5, v5, np.full((3, 5), np.nan)), ValueError, "mask"),
    ("mask +inf", lambda: R.dot_product(q3, k5, v5, np.full((3, 5), np.inf)), ValueError, "mask"),
    ("scale 0", lambda: R.scaled_dot_product(q3, k5, v5, scale=0), ValueError, "scale"),
    ("scale < 0", lambda: R.scaled_dot_product(q3, k5, v5, scale=-1.0), ValueError, "scale"),
    ("scale inf", lambda: R.scaled_dot_product(q3, k5, v5, scale=math.inf), ValueError, "scale"),
    ("scale nan", lambda: R.scaled_dot_product(q3, k5, v5, scale=math.nan), ValueError, "scale"),
    ("scale str", lambda: R.scaled_dot_product(q3, k5, v5, scale="2"), TypeError, "scale"),
    ("scale bool", lambda: R.scaled_dot_product(q3, k5, v5, scale=True), TypeError, "scale"),
    ("w_v 2-D", lambda: R.additive(q3, k5, v5, W44, W44, W44), ValueError, "w_v"),
    ("W_q shape", lambda: R.additive(q3, k5, v5, W42, W44, np.ones(4)), ValueError, "W_q"),
    ("W_k shape", lambda: R.additive(q3, k5, v5, W44, W42.T, np.ones(4)), ValueError, "W_k"),
    ("W shape", lambda: R.general(q3, k5, v5, W42), ValueError, "W"),
    ("W bool", lambda: R.general(q3, k5, v5, W44 > 0), TypeError, "W"),
    ("X rank 1", lambda: R.self_attention(X[0], W44, W44, W42), ValueError, "X"),
    ("SA W_q rows", lambda: R.self_attention(X, W44[:3], W44, W42), ValueError, "W_q"),
    ("SA W_k cols", lambda: R.self_attention(X, W44, W42, W42), ValueError, "W_k"),
    ("SA W_v rows", lambda: R.self_attention(X, W44, W44, W42[:3]), ValueError, "W_v"),
    ("num_heads 0", _mh(num_heads=0), ValueError, "num_heads"),
    ("num_heads float", _mh(num_heads=1.5), TypeError, "num_heads"),
    ("MH W_q split", _mh(num_heads=3), ValueError, "W_q"),
    ("MH W_k cols", _mh(W_k=W42.repeat(3, axis=1)), ValueError, "W_k"),
    ("MH W_v rows", _mh(W_v=W44[:3]), ValueError, "W_v"),
    ("MH W_o rows", _mh(W_o=W44[:3]), ValueError, "W_o"),
    ("MH X_kv batch", _mh(X_kv=X[None]), ValueError, "X_kv"),
    ("MH mask heads", _mh(mask=np.ones((3, 5, 5), bool)), ValueError, "mask"),
    ("positions n 0", lambda: R.sinusoidal_positions(0, 4), ValueError, "n"),
    ("positions n bool", lambda: R.sinusoidal_positions(True, 4), TypeError, "n"),
    ("positions d float", lambda: R.sinusoidal_positions(3, 4.0), TypeError, "d"),
]


@pytest.mark.parametrize("call,exc,name", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(call, exc, name):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert re.match(rf"{re.escape(name)}\b", msg), f"message should start with {name!r}: {msg}"

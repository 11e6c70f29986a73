"""Shared helpers of the reference tests: the hand loop (one query at a time, as in seed 000
section 3), small loops and masks, and seed 004's worked inputs.

The oracle is vectorised NumPy; the tests check it against these explicit Python loops, against
algebraic identities, and against seed 004's worked examples recomputed from the formulas.
Expected values are always computed in the test, never copied from the seeds' text or from the
library's output.
"""

from __future__ import annotations

import math

import numpy as np

REL = 1e-12  # vectorised float64 vs Python loops: only the summation order differs


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


SEED004 = dict(
    Q=np.array([[1.0, 0.0], [0.0, 1.0]]),
    K=np.array([[1.0, 2.0], [3.0, 4.0]]),
    V=np.array([[5.0, 6.0], [7.0, 8.0]]),
)


def softmax_pair(e1: float, e2: float) -> tuple[float, float]:
    a1 = np.exp(e1) / (np.exp(e1) + np.exp(e2))
    a2 = np.exp(e2) / (np.exp(e1) + np.exp(e2))
    return a1, a2

"""attnkit.reference.dropout: the keep mask against the hash written out with Python integers
(one entry at a time, mod 2**64), the dropout output against a hand loop, bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.reference.dropout import dropout_output, keep_mask

MOD = 1 << 64


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) % MOD
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) % MOD
    return z ^ (z >> 31)


def _keep(seed: int, bh: int, i: int, j: int, p: float) -> bool:
    golden = 0x9E3779B97F4A7C15
    row = _mix((_mix((seed + (bh + 1) * golden) % MOD) + (i + 1) * golden) % MOD)
    u = _mix((row + (j // 4 + 1) * 0xD1B54A32D192ED03) % MOD)
    word = (u >> (16 * (j % 4))) & 0xFFFF
    return word >= round(p * 2**16)


@pytest.mark.parametrize("seed", [0, 1, 2**62 - 1])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.999])
def test_keep_mask_equals_the_hash_entry_by_entry(seed, p):
    got = keep_mask(seed, (2, 3), 5, 7, p)
    assert got.shape == (2, 3, 5, 7) and got.dtype == np.bool_
    want = np.array(
        [
            [
                [[_keep(seed, b * 3 + h, i, j, p) for j in range(7)] for i in range(5)]
                for h in range(3)
            ]
            for b in range(2)
        ]
    )
    assert np.array_equal(got, want)
    if p == 0.0:
        assert got.all()


def test_dropout_output_by_hand():
    rng = np.random.default_rng(0)
    w = rng.random((2, 4, 5))
    w /= w.sum(-1, keepdims=True)
    v = rng.standard_normal((2, 5, 3))
    keep = rng.random((2, 4, 5)) < 0.6
    got = dropout_output(w, v, keep, 0.4)
    want = np.zeros((2, 4, 3))
    for b in range(2):
        for i in range(4):
            for j in range(5):
                if keep[b, i, j]:
                    want[b, i] += w[b, i, j] / 0.6 * v[b, j]
    assert np.abs(got - want).max() <= 1e-14


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="^seed"):
        keep_mask(-1, (1,), 2, 2, 0.1)
    with pytest.raises(ValueError, match="^p"):
        keep_mask(0, (1,), 2, 2, 1.5)
    with pytest.raises(TypeError, match="^seed"):
        keep_mask(1.5, (1,), 2, 2, 0.1)

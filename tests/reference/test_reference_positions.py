"""attnkit.reference.positions against a loop over the formula of seed 003."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnkit import reference as R


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

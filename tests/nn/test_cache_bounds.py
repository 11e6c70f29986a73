"""KVCache's input checks, its growth buffer and the bounds it keeps for the overflow policy.

Bounds (max|k|, finiteness of k and v) are compared with a full scan of what the cache holds
(``torch.aminmax``/``isfinite`` on ``cache.k``/``cache.v``) after appends, beam reorders, resets
and keys set from outside; the buffer's views with ``torch.cat`` of every appended step; the
policy with known bounds against the policy scanning the same tensors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels.policy import kv_bounds, scan
from attnkit.nn import KVCache, MultiHeadAttention


def _scan(k: torch.Tensor, v: torch.Tensor) -> tuple[float, bool]:
    """max|k| (nan when a NaN, else inf when an inf) and finiteness, the slow way."""
    if torch.isnan(k).any():
        m = math.nan
    else:
        m = float(k.abs().max())
    return m, bool(torch.isfinite(k).all() and torch.isfinite(v).all())


def _same(b: kv_bounds.KVBounds, k, v) -> None:
    m, ok = _scan(k, v)
    assert b.finite == ok
    assert (math.isnan(b.max_abs_k) and math.isnan(m)) or b.max_abs_k == m, (b, m)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    batch=st.integers(1, 4),
    spike=st.sampled_from([None, 1e30, math.inf, math.nan]),
    spike_at=st.integers(0, 30),
    reorder_at=st.integers(0, 6),
    seed=st.integers(0, 2**16),
)
def test_bounds_equal_a_full_scan(steps, batch, spike, spike_at, reorder_at, seed):
    gen = torch.Generator().manual_seed(seed)
    c = KVCache()
    for i, n in enumerate(steps):
        k = torch.randn(batch, 2, n, 3, generator=gen)
        v = torch.randn(batch, 2, n, 4, generator=gen)
        if spike is not None and spike_at < n * 3:
            (k if spike_at % 2 else v)[batch - 1, 0, spike_at // 3 % n, 0] = spike
            spike = None
        c.update(k, v, n)
        _same(c.bounds(), c.k, c.v)
        _same(kv_bounds.known(c.k, c.v), c.k, c.v)  # what the policy will read
        if i == reorder_at:
            idx = torch.randint(0, batch, (batch,), generator=gen)
            c.reorder(idx)
            _same(c.bounds(), c.k, c.v)
    c.reset()
    assert c.bounds() is None and c.k is None


def test_growth_buffer_equals_concatenation_and_keeps_old_views():
    gen = torch.Generator().manual_seed(1)
    c, ks, vs, seen = KVCache(), [], [], []
    with torch.inference_mode():
        for n in (7, 1, 1, 3, 80, 1):
            k, v = torch.randn(2, 3, n, 5, generator=gen), torch.randn(2, 3, n, 6, generator=gen)
            ks.append(k)
            vs.append(v)
            got_k, got_v = c.update(k, v, n)
            assert torch.equal(got_k, torch.cat(ks, 2)) and torch.equal(got_v, torch.cat(vs, 2))
            seen.append((got_k, torch.cat(ks, 2)))
    for view, want in seen:  # earlier returned tensors still hold what they held
        assert torch.equal(view, want)


def test_keys_set_from_outside_are_scanned_again():
    gen = torch.Generator().manual_seed(2)
    c = KVCache()
    c.update(torch.randn(1, 2, 9, 4, generator=gen), torch.randn(1, 2, 9, 4, generator=gen), 9)
    c.k = c.k * 1e3  # as LMCache.keep_last (a slice) or a user would
    _same(c.bounds(), c.k, c.v)
    c.update(torch.randn(1, 2, 1, 4, generator=gen), torch.randn(1, 2, 1, 4, generator=gen), 1)
    _same(c.bounds(), c.k, c.v)


def test_in_place_change_forgets_the_bounds():
    c = KVCache()
    k, v = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    c.update(k, v, 4)
    assert kv_bounds.known(c.k, c.v) is not None
    c.k.mul_(2)
    assert kv_bounds.known(c.k, c.v) is None


def test_policy_with_known_bounds_matches_the_scanning_policy():
    """Huge cached keys: the policy (dense backend, Lq = 20 > decode's rows) must still go to
    float64 with the cache's bounds; NaN in the cached values still gives P6's NaN rows."""
    gen = torch.Generator().manual_seed(3)
    c = KVCache()
    k = torch.randn(1, 2, 30, 8, generator=gen) * 1e19
    v = torch.randn(1, 2, 30, 8, generator=gen)
    v[0, 1, 5, 0] = math.nan
    kk, vv = c.update(k, v, 30)
    q = torch.randn(1, 2, 20, 8, generator=gen) * 1e19
    mask = M.causal("bottom_right")
    with torch.no_grad():
        known = F.scaled_dot_product_attention(q, kk, vv, mask, backend="dense")
        fresh = F.scaled_dot_product_attention(q, k.clone(), v.clone(), mask, backend="dense")
    torch.testing.assert_close(known, fresh, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(known[0, 1]).all() and torch.isfinite(known[0, 0]).all()


@pytest.mark.parametrize(
    "args,err,match",
    [
        (("k", "v", 1), TypeError, r"^k: expected a torch.Tensor, got str"),
        ((torch.zeros(2, 3), torch.zeros(2, 3), 1), ValueError, r"^k: expected 4 dims"),
        ((torch.zeros(1, 2, 3, 4), "v", 1), TypeError, r"^v: expected a torch.Tensor"),
        ((torch.zeros(1, 2, 3, 4, dtype=torch.long),) * 2 + (1,), TypeError, r"^k: .*float"),
        ((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4).double(), 1), TypeError, r"^v: "),
        ((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4), 1), ValueError, r"^v: expected \(B"),
        ((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), -1), ValueError, r"^q_len"),
    ],
)
def test_update_refuses_bad_input_by_name(args, err, match):
    c = KVCache()
    with pytest.raises(err, match=match):
        c.update(*args)
    assert c.k is None and c.seen == 0  # nothing changed


def test_update_refuses_what_does_not_match_the_cache():
    c = KVCache()
    c.update(torch.zeros(2, 2, 3, 4), torch.zeros(2, 2, 3, 5), 3)
    bad = [
        ((torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 5)), ValueError, r"^k: .*batch, heads"),
        ((torch.zeros(2, 3, 1, 4), torch.zeros(2, 3, 1, 5)), ValueError, r"^k: .*batch, heads"),
        ((torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 6)), ValueError, r"^v: .*batch, heads"),
        ((torch.zeros(2, 2, 1, 4).double(),) * 2, TypeError, r"^k: expected dtype"),
    ]
    for (k, v), err, match in bad:
        with pytest.raises(err, match=match):
            c.update(k, v, 1)
    assert c.size == 3 and c.seen == 3


def test_claim_refuses_what_is_not_a_module():
    c = KVCache()
    with pytest.raises(TypeError, match=r"^module: expected the torch.nn.Module .* \(str\)"):
        c.claim("not a module")
    mha = MultiHeadAttention(8, 2, batch_first=True)
    c.claim(mha)
    with pytest.raises(ValueError, match="belongs to another attention module"):
        c.claim(MultiHeadAttention(8, 2, batch_first=True))


def test_bounds_of_an_empty_cache_are_zero_and_finite():
    """A cache with no rows (a window cropped to nothing) has max|k| 0 and is finite; appending
    rows then gives exactly the bounds of those rows."""
    from attnkit.kernels.policy.kv_bounds import RowBounds

    empty = torch.zeros(2, 3, 0, 4)
    b = RowBounds.of(empty, empty)
    assert b.k_max.tolist() == [0.0, 0.0] and b.finite.tolist() == [True, True]
    k = torch.tensor([[[[1.0, -7.0]]], [[[2.5, float("inf")]]]])
    grown = b.extend(k, torch.ones_like(k))
    assert grown.k_max.tolist() == [7.0, float("inf")]
    assert grown.finite.tolist() == [True, False]


@pytest.mark.parametrize("batch", [1, 3, 8, 9, 20])  # both sides of kv_bounds.FEW_ROWS
def test_row_bounds_match_a_torch_scan_with_nan_and_inf(batch):
    """RowBounds.of / bounds (row by row with the bit scan for few rows, torch reductions for
    many) against max|k| and isfinite computed directly; NaN wins over inf in a row."""
    from attnkit.kernels.policy.kv_bounds import RowBounds

    g = torch.Generator().manual_seed(batch)
    k, v = torch.randn(batch, 2, 5, 4, generator=g), torch.randn(batch, 2, 5, 3, generator=g)
    if batch > 1:
        k[1, 0, 2, 1] = float("inf")
        v[-1, 1, 0, 0] = float("nan")
    if batch > 2:
        k[2, 1, 4, 3], k[2, 0, 0, 0] = float("nan"), float("-inf")
    scan.absmax(torch.zeros(1))  # the bit scan loaded, as after a process's first call
    b = RowBounds.of(k, v)
    want = [math.nan if r.isnan().any() else float(r.abs().max()) for r in k]
    np.testing.assert_array_equal(b.k_max.numpy(), np.array(want))
    ok = [bool(torch.isfinite(k[i]).all() and torch.isfinite(v[i]).all()) for i in range(batch)]
    assert b.finite.tolist() == ok
    total = b.bounds()
    assert total.finite == all(ok)
    if batch > 2:
        assert math.isnan(total.max_abs_k)
    elif batch == 1:
        assert total.max_abs_k == want[0]

"""KVCache: cached step-by-step decoding equals the full forward for every mask kind that makes
sense causally; masks whose alignment would misplace the cached keys are refused before any
work; the cache's own API (update / size / positions / reset / reorder) against plain indexing.

Reference: the full (uncached) forward of the same module in float64, tolerance 1e-10 relative
(norm of the difference over the norm of the reference).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import masks as M
from attnkit.nn import ALiBi, KVCache, MultiHeadAttention, RotaryEmbedding
from attnkit.nn.cache import DecoderCache
from tests.support.numerics import rel_err

B, L, E, H = 3, 11, 16, 4
BR = "bottom_right"
F64_TOL = 1e-10
STEPS = ([1] * L, [3, 1, 4, 2, 1])  # token by token, and odd chunks
PREFIX_STEPS = ([4] + [1] * 7, [5, 3, 1, 2])  # the prompt (prefix) first, in one call
IDS = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3])


def _predicate(b, h, q, k):
    return (k <= q) & ((q - k) % 3 != 2)


# name: (module options, full-forward mask, step mask (start, n) -> mask, step plans)
CASES = {
    "causal": ({}, M.causal(), lambda s, n: M.causal(BR), STEPS),
    "window": ({}, M.sliding_window(3, 0), lambda s, n: M.sliding_window(3, 0, BR), STEPS),
    "window&causal": (
        {},
        M.sliding_window(2) & M.causal(),
        lambda s, n: M.sliding_window(2, alignment=BR) & M.causal(BR),
        STEPS,
    ),
    "prefix_lm": ({}, M.prefix_lm(4), lambda s, n: M.prefix_lm(4, BR), PREFIX_STEPS),
    "prefix_lm per batch": (
        {},
        M.prefix_lm([4, 0, 2]),
        lambda s, n: M.prefix_lm([4, 0, 2], alignment=BR),
        PREFIX_STEPS,
    ),
    "key_padding&causal": (
        {},
        M.key_padding([11, 6, 1]) & M.causal(),
        lambda s, n: M.key_padding([11, 6, 1]) & M.causal(BR),
        STEPS,
    ),
    "alibi&causal": (
        {},
        ALiBi(H)() & M.causal(),
        lambda s, n: ALiBi(H)() & M.causal(BR),
        STEPS,
    ),
    "document&causal": (
        {},
        M.document(IDS) & M.causal(),
        lambda s, n: M.document(IDS[s : s + n], kv_ids=IDS[: s + n]) & M.causal(BR),
        STEPS,
    ),
    "predicate": (
        {},
        M.from_predicate(_predicate),
        lambda s, n: M.from_predicate(_predicate, alignment=BR),
        STEPS,
    ),
    "gqa": ({"num_kv_heads": 2}, M.causal(), lambda s, n: M.causal(BR), STEPS),
    "mqa+rope": (
        {"num_kv_heads": 1, "rotary": RotaryEmbedding(E // H)},
        M.causal(),
        lambda s, n: M.causal(BR),
        STEPS,
    ),
    "rope+window": (
        {"rotary": RotaryEmbedding(E // H)},
        M.sliding_window(2, 0),
        lambda s, n: M.sliding_window(2, 0, BR),
        STEPS,
    ),
}


def _module(seed: int, **kw) -> MultiHeadAttention:
    torch.manual_seed(seed)
    mha = MultiHeadAttention(E, H, dtype=torch.float64, **kw).eval()
    for p in mha.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return mha.requires_grad_(False)


def _decode(mha, x, step_mask, steps) -> tuple[torch.Tensor, KVCache]:
    cache, outs, pos = mha.new_cache(), [], 0
    for n in steps:
        out, w = mha(
            x[:, pos : pos + n], mask=step_mask(pos, n), cache=cache, return_weights=n == 1
        )
        assert w is None or w.shape == (B, H, 1, pos + 1)
        outs.append(out)
        pos += n
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("name", list(CASES))
def test_cached_decoding_equals_the_full_forward(name):
    options, full_mask, step_mask, plans = CASES[name]
    mha = _module(1, **options)
    x = torch.randn(B, L, E, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    full, _ = mha(x, mask=full_mask)
    for steps in plans:
        got, cache = _decode(mha, x, step_mask, steps)
        assert cache.size == cache.seen == L
        assert cache.k.shape == (B, options.get("num_kv_heads", H), L, E // H)
        assert rel_err(got, full) <= F64_TOL, (name, steps)
    # the mask matters: without it the full forward differs, so this test can fail
    assert rel_err(mha(x)[0], full) > 1e-3


@st.composite
def decodes(draw):
    """(module options, full mask, step mask, chunks, length) for a random causal decode."""
    length = draw(st.integers(1, 13))
    kind = draw(st.sampled_from(["causal", "window", "prefix", "padding", "alibi", "predicate"]))
    first = draw(st.integers(1, length))
    chunks, left = [first], length - first
    while left:
        chunks.append(draw(st.integers(1, left)))
        left -= chunks[-1]
    w = draw(st.integers(0, 4))
    lengths = draw(st.lists(st.integers(0, length + 2), min_size=B, max_size=B))
    n = draw(st.integers(0, first))  # the prefix is the first call's queries (or less)
    full, step = {
        "causal": (M.causal(), M.causal(BR)),
        "window": (M.sliding_window(w, 0), M.sliding_window(w, 0, BR)),
        "prefix": (M.prefix_lm(n), M.prefix_lm(n, BR)),
        "padding": (M.key_padding(lengths) & M.causal(), M.key_padding(lengths) & M.causal(BR)),
        "alibi": (ALiBi(H)() & M.causal(), ALiBi(H)() & M.causal(BR)),
        "predicate": (
            M.from_predicate(_predicate),
            M.from_predicate(_predicate, alignment=BR),
        ),
    }[kind]
    options = {"num_kv_heads": draw(st.sampled_from([1, 2, 4]))}
    if draw(st.booleans()):
        options["rotary"] = RotaryEmbedding(E // H)
    return options, full, step, chunks, length


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decodes(), st.integers(0, 2**16))
def test_any_chunking_of_a_causal_decode_equals_the_full_forward(case, seed):
    options, full_mask, step_mask, chunks, length = case
    mha = _module(seed, **options)
    x = torch.randn(
        B, length, E, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )
    full, _ = mha(x, mask=full_mask)
    got, cache = _decode(mha, x, lambda s, n: step_mask, chunks)
    assert cache.size == cache.seen == length
    assert rel_err(got, full) <= F64_TOL


TOP_LEFT = {
    "causal": M.causal(),
    "window": M.sliding_window(3, 0),
    "prefix_lm": M.prefix_lm(4),
    "predicate": M.from_predicate(_predicate),
    "padding&window": M.key_padding([9, 9, 9]) & M.sliding_window(2, 0),
    "union": M.sliding_window(1, 0, BR) | M.prefix_lm(2),
}


@pytest.mark.parametrize("name", list(TOP_LEFT))
def test_top_left_masks_are_refused_once_keys_are_cached(name):
    mask = TOP_LEFT[name]
    mha = _module(3)
    x = torch.randn(B, 5, E, dtype=torch.float64)
    cache = mha.new_cache()
    first, _ = mha(x[:, :3], mask=mask, cache=cache)  # nothing cached yet: both alignments agree
    assert rel_err(first, mha(x[:, :3], mask=mask)[0]) <= F64_TOL
    k_before = cache.k
    with pytest.raises(ValueError, match=r"mask: .*top-left aligned.*bottom_right"):
        mha(x[:, 3:4], mask=mask, cache=cache)
    assert cache.k is k_before and cache.size == cache.seen == 3  # refused before any work


def test_the_refusal_counts_one_cached_key_in_the_singular():
    mha = _module(3)
    x = torch.randn(B, 2, E, dtype=torch.float64)
    cache = mha.new_cache()
    mha(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match=r"with 1 cached key it would"):
        mha(x[:, 1:], mask=M.causal(), cache=cache)


def test_static_cache_refuses_position_masks_after_the_first_call():
    mha = _module(4)
    x, mem = torch.randn(B, 4, E, dtype=torch.float64), torch.randn(B, 6, E, dtype=torch.float64)
    cache = KVCache(static=True)
    mha(x[:, :2], mem, mask=M.causal(BR), cache=cache)  # first call: a plain call
    with pytest.raises(ValueError, match="mask: .*static"):
        mha(x[:, 2:3], mask=M.causal(BR), cache=cache)
    pad = M.key_padding([6, 2, 4])
    got, _ = mha(x[:, 2:3], mask=pad, cache=cache)  # masks over keys only stay fine
    assert rel_err(got, mha(x[:, 2:3], mem, mask=pad)[0]) <= F64_TOL
    assert cache.seen == 3


def test_update_size_positions_reset():
    g = torch.Generator().manual_seed(5)
    k1, v1 = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 4, 7, generator=g)
    k2, v2 = torch.randn(2, 3, 1, 5, generator=g), torch.randn(2, 3, 1, 7, generator=g)
    c = KVCache()
    assert c.size == c.length == 0 and c.positions() == (0, 0)
    k, v = c.update(k1, v1, 4)
    assert k is k1 and v is v1 and c.positions() == (4, 4)
    k, v = c.update(k2, v2, 1)
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))
    assert c.size == 5 and c.positions() == (5, 5)
    with pytest.raises(ValueError, match="k: the new keys"):
        c.update(k2[:1], v2[:1], 1)
    c.reset()
    assert c.k is None and c.size == c.seen == 0
    s = KVCache(static=True)
    s.update(k1, v1, 2)
    k, v = s.update(None, None, 3)
    assert k is k1 and v is v1 and s.positions() == (5, 4)
    assert not hasattr(KVCache, "concat") and not hasattr(KVCache, "append")


def test_reorder_selects_rows_and_checks_the_index():
    g = torch.Generator().manual_seed(6)
    k, v = torch.randn(3, 2, 4, 5, generator=g), torch.randn(3, 2, 4, 5, generator=g)
    c = KVCache()
    c.update(k, v, 4)
    idx = torch.tensor([2, 0, 0, 1])
    c.reorder(idx)
    assert torch.equal(c.k, k[[2, 0, 0, 1]]) and torch.equal(c.v, v[[2, 0, 0, 1]])
    bad = [
        ([0, 1], TypeError),
        (torch.tensor([0.0, 1.0]), TypeError),
        (torch.tensor([True, False]), TypeError),
        (torch.tensor([[0, 1]]), ValueError),
        (torch.tensor([], dtype=torch.long), ValueError),
        (torch.tensor([0, 4]), ValueError),
        (torch.tensor([-1, 0]), ValueError),
    ]
    for index, exc in bad:
        with pytest.raises(exc, match="index"):
            c.reorder(index)
    with pytest.raises(TypeError, match="index"):
        DecoderCache.empty(2).reorder([0])  # checked even while the caches are empty
    assert torch.equal(c.k, k[[2, 0, 0, 1]])  # refused reorders change nothing


def test_cache_constructor_arguments():
    with pytest.raises(TypeError, match="static"):
        KVCache(static="yes")
    with pytest.raises(TypeError, match="num_layers"):
        DecoderCache.empty(True)
    with pytest.raises(ValueError, match="num_layers"):
        DecoderCache.empty(0)

"""KV-cache semantics of torchtune's ``tests/torchtune/modules/test_kv_cache.py`` (update /
size / reset) and transformers' ``DynamicCache`` (``reorder_cache(beam_idx)`` =
``index_select`` on the batch dim), on :class:`attnkit.nn.KVCache`: what update returns is the
plain concatenation of everything appended, across the growth buffer's reallocations, in and
out of inference mode; reorder then append equals reordering the concatenation; bad updates
are refused before the cache changes (an empty batch crashed inside the bounds scan).

Reference: ``torch.cat`` / ``index_select`` of the appended tensors (exact equality)."""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import KVCache
from attnkit.nn.cache import MIN_ROOM


def chunks(n_steps, b=2, g=3, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    sizes = [(i * 7) % 5 + 1 for i in range(n_steps)]
    return [(torch.randn(b, g, n, d, generator=gen), torch.randn(b, g, n, d + 1, generator=gen))
            for n in sizes]  # fmt: skip


@pytest.mark.parametrize("mode", ["no_grad", "inference", "switch"])
def test_update_returns_the_concatenation_across_growth(mode):
    # torchtune test_kv_cache_update / size: many appends, more rows than the first buffer
    steps = chunks(60)
    assert sum(k.shape[2] for k, _ in steps) > 2 * MIN_ROOM  # at least one reallocation
    c = KVCache()
    for i, (k, v) in enumerate(steps):
        inference = mode == "inference" or (mode == "switch" and i % 2)
        ctx = torch.inference_mode() if inference else torch.no_grad()
        with ctx:
            got_k, got_v = c.update(k, v, k.shape[2])
        want_k = torch.cat([s[0] for s in steps[: i + 1]], 2)
        want_v = torch.cat([s[1] for s in steps[: i + 1]], 2)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        assert c.size == want_k.shape[2] == c.seen


def test_reset_then_reuse():
    # torchtune test_kv_cache_reset: size 0 after reset; the next update starts afresh
    c = KVCache()
    for k, v in chunks(5):
        c.update(k, v, 1)
    c.reset()
    assert c.size == 0 and c.k is None and c.positions() == (0, 0)
    (k, v), *_ = chunks(1, b=4, g=1, d=2, seed=3)  # another batch and width after reset
    got_k, got_v = c.update(k, v, 2)
    assert torch.equal(got_k, k) and torch.equal(got_v, v) and c.positions() == (2, k.shape[2])


@pytest.mark.parametrize("beam_idx", [[1, 1], [1, 0], [0]])
def test_reorder_then_append_equals_reordering_the_concatenation(beam_idx):
    # DynamicCache.reorder_cache(beam_idx) during beam search, then more tokens
    steps = chunks(8)
    c = KVCache()
    for k, v in steps[:5]:
        c.update(k, v, 1)
    idx = torch.tensor(beam_idx)
    c.reorder(idx)
    for k, v in steps[5:]:
        got_k, got_v = c.update(k[idx], v[idx], 1)
    want_k = torch.cat([s[0] for s in steps[:5]], 2)[idx]
    want_k = torch.cat([want_k] + [s[0][idx] for s in steps[5:]], 2)
    want_v = torch.cat([s[1] for s in steps[:5]], 2)[idx]
    want_v = torch.cat([want_v] + [s[1][idx] for s in steps[5:]], 2)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("shape", [(0, 2, 1, 4), (2, 0, 1, 4), (2, 2, 1, 0)])
def test_empty_batch_heads_or_width_are_refused(shape):
    # was: RuntimeError "max(): Expected reduction dim ..." from the bounds scan for B = 0
    c = KVCache()
    with pytest.raises(ValueError, match=r"k: expected B, G and dk"):
        c.update(torch.zeros(shape), torch.zeros(shape), 1)
    assert c.size == 0 and c.k is None and c.seen == 0

"""Which backend ``auto`` dispatch picks for padded and windowed calls (the blocksparse backend's
``speed_reasons``; the rule and its measurements: ``ELEMENT_CALL_ENTRIES`` in
:mod:`attnkit.kernels.blocksparse`). Nothing is computed: only the block maps are read.

- Key padding whose length varies per batch element (a BERT batch) leaves blocks empty in only
  some elements: skipping them takes one SDPA call per element and query block, which measured
  slower than the dense backend unless each call skips more than 2**20 score entries.
- Blocks empty in every element (windows, the same padding for the whole batch) keep
  blocksparse, at every length where at least MIN_EMPTY of them are empty.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnkit.kernels.blocksparse as bs
from attnkit import functional as F
from attnkit import masks as M
from attnkit.kernels.tuning import DEFAULT, use


@pytest.fixture(autouse=True)
def xeon_rule():
    """The rule these tests pin down is the one measured on the project's Xeon (MIN_EMPTY 0.2
    there); the built-in default's own value is checked in test_dispatch_tuning.py."""
    with use(dataclasses.replace(DEFAULT, blocksparse_min_empty=0.2)):
        yield


def _qkv(b: int, h: int, lq: int, d: int = 32, lk: int | None = None, grad: bool = False):
    """Zero tensors of the given shapes (their values never matter to the choice); expanded
    views, so large shapes cost no memory."""
    lk = lq if lk is None else lk
    q = torch.zeros(1, 1, 1, 1).expand(b, h, lq, d)
    k = torch.zeros(1, 1, 1, 1).expand(b, h, lk, d)
    if grad:
        q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    return q, k, k


def _bert_lengths(n: int = 32, width: int = 256) -> torch.Tensor:
    """The benchmark's BERT batch: lengths 16..width, padded to the longest."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, width + 1, (n,), generator=g)
    lengths[0] = width
    return lengths


def test_bert_padded_batch_goes_to_blocksparse_per_element():
    """(32, 12, 256, 32) with per-element padding (about 30-40% of the blocks empty per
    element, none in every element): each of the 64 per-element calls skips more than
    ``ELEMENT_CALL_ENTRIES``, so blocksparse, with a note naming them."""
    mask = M.KeyPadding(_bert_lengths())
    d = F.explain_dispatch(*_qkv(32, 12, 256), mask)
    assert d.chosen == "blocksparse", str(d)
    assert "64 per-element query blocks" in str(d), str(d)
    # the same with gradients (a fine-tuning step) and with a longer padded batch
    assert F.explain_dispatch(*_qkv(32, 12, 256, grad=True), mask).chosen == "blocksparse"
    long = M.KeyPadding(_bert_lengths(8, 1024))
    assert F.explain_dispatch(*_qkv(8, 12, 1024), long).chosen == "blocksparse"


def test_small_per_element_calls_go_to_dense():
    """Four heads: each per-element call skips fewer entries than ``ELEMENT_CALL_ENTRIES``
    (about 38k), so dense, with a reason naming the calls and the threshold."""
    mask = M.KeyPadding(_bert_lengths())
    d = F.explain_dispatch(*_qkv(32, 4, 256), mask)
    assert d.chosen == "dense", str(d)
    (why,) = d.reasons["blocksparse"]
    assert "per batch element" in why and "64 query blocks" in why, why
    assert f"{bs.ELEMENT_CALL_ENTRIES:,}" in why, why


def test_forced_blocksparse_still_serves_the_bert_batch():
    """The rule is a speed preference: backend="blocksparse" ignores it."""
    mask = M.KeyPadding(_bert_lengths())
    d = F.explain_dispatch(*_qkv(32, 12, 256), mask, backend="blocksparse")
    assert d.chosen == "blocksparse", str(d)


def test_padding_shared_by_the_batch_keeps_blocksparse():
    """The same padding for every element: the empty blocks are skipped with one call per
    query block, at short and long lengths."""
    for b, h, n, valid in ((32, 12, 256, 128), (32, 12, 128, 64), (1, 8, 4096, 2048)):
        mask = M.KeyPadding(torch.full((b,), valid))
        d = F.explain_dispatch(*_qkv(b, h, n), mask)
        assert d.chosen == "blocksparse", (b, h, n, str(d))


def test_per_element_padding_with_large_calls_keeps_blocksparse():
    """(2, 8, 4096, 32) with 0% and 75% padding: 64 per-element calls of about 0.8M skipped
    entries each: blocksparse. (2, 4, 512, 32) with lengths 512 and 128: 8 calls of exactly
    ELEMENT_CALL_ENTRIES (98,304) each, the least that counts: blocksparse; half the heads
    (49,152 each): dense."""
    assert bs.ELEMENT_CALL_ENTRIES == 98_304  # the cases below sit on it
    lengths = torch.tensor([4096, 1024])
    assert F.explain_dispatch(*_qkv(2, 8, 4096), M.KeyPadding(lengths)).chosen == "blocksparse"
    short = M.KeyPadding(torch.tensor([512, 128]))
    assert F.explain_dispatch(*_qkv(2, 4, 512), short).chosen == "blocksparse"
    d = F.explain_dispatch(*_qkv(2, 2, 512), short)
    assert d.chosen == "dense", str(d)
    assert "8 query blocks of 49,152 skipped score entries each" in str(d), str(d)


def test_long_windowed_calls_keep_blocksparse():
    """Mistral-shaped sliding windows: prefill and training step, with and without padding that
    varies per element (the window's empty blocks are empty in every element)."""
    window = M.SlidingWindow(511, 0)
    for n in (1024, 4096, 8192):
        d = F.explain_dispatch(*_qkv(1, 8, n), window)
        assert d.chosen == "blocksparse", (n, str(d))
    d = F.explain_dispatch(*_qkv(1, 8, 4096, grad=True), window)
    assert d.chosen == "blocksparse", str(d)
    padded = window & M.KeyPadding(torch.tensor([4096, 3000, 100]))
    d = F.explain_dispatch(*_qkv(3, 8, 4096), padded)
    assert d.chosen == "blocksparse", str(d)


def test_little_empty_per_element_goes_to_dense():
    """Under MIN_EMPTY empty per element on average: dense, whatever the sizes."""
    lengths = torch.tensor([4096, 4096, 4096, 3500])
    d = F.explain_dispatch(*_qkv(4, 8, 4096), M.KeyPadding(lengths))
    assert d.chosen == "dense", str(d)
    assert any("leaves only" in r for r in d.reasons["blocksparse"]), str(d)

"""The ``blocksparse`` backend computes O(L * w) entries for windowed masks and only the
diagonal blocks of documents, and its backward saves O(L) memory: counted from tile sizes
and saved tensors (no timing here)."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit.kernels.blocksparse as bs
from attnkit import functional as F
from attnkit import masks as M


def inputs(batch: tuple[int, ...], length: int, d: int) -> list[torch.Tensor]:
    """q, k, v (*batch, length, d) float32 leaves (the counts below do not depend on values)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch + (length, d), generator=g).requires_grad_() for _ in range(3)]


def _sorted_ids(n, ndoc, g):
    return torch.sort(torch.randint(0, ndoc, (n,), generator=g)).values


# ---------------------------------------------------------------------------------------------
# memory: O(L * w), counted
# ---------------------------------------------------------------------------------------------
class _Watch:
    """Records the (batch, query rows, keys) of every fused SDPA call the backend makes."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[int, int, int]] = []
        orig = bs.tiles.sdpa_fwd

        def fwd(q, k, v, mask, scale, is_causal):
            self.calls.append((math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2]))
            return orig(q, k, v, mask, scale, is_causal)

        monkeypatch.setattr(bs.tiles, "sdpa_fwd", fwd)

    def largest_tile(self) -> int:
        return max(r * c for _, r, c in self.calls)

    def total_entries(self) -> int:
        return sum(b * r * c for b, r, c in self.calls)


L_MEM, W_MEM = 4096, 64


@pytest.mark.parametrize(
    "name,mask,tile_bound",
    [
        # band: one batched call of nb windows, (bq + 2w) keys each
        ("window", M.sliding_window(W_MEM), bs.BLOCK_Q + 2 * W_MEM),
        ("local_causal", M.sliding_window(W_MEM) & M.causal(), bs.BLOCK_Q + W_MEM),
        # rows: bq rows against the window plus one key block either side
        (
            "padded_window",
            M.key_padding([L_MEM, 1000]) & M.sliding_window(W_MEM),
            bs.BLOCK_Q + 2 * W_MEM + 2 * bs.BLOCK_KV,
        ),
    ],
)
def test_windowed_masks_compute_o_l_w_entries(name, mask, tile_bound, monkeypatch):
    watch = _Watch(monkeypatch)
    q, k, v = inputs((2, 2), L_MEM, 8)
    out = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
    out.sum().backward()
    heads = 2 * 2
    rows = math.ceil(L_MEM / bs.BLOCK_Q) * bs.BLOCK_Q
    assert watch.calls
    # per query row, never more keys than the window plus block rounding ...
    assert watch.total_entries() <= heads * rows * tile_bound
    # ... which is far from the L x L a dense kernel computes
    assert watch.total_entries() <= heads * L_MEM * L_MEM // 8
    # no call sees more than a block of queries against its window
    assert watch.largest_tile() <= bs.BLOCK_Q * tile_bound
    if name != "padded_window":  # the interior windows in one batched call, plus the two ends
        assert len(watch.calls) <= 3


def test_documents_compute_only_their_diagonal_blocks(monkeypatch):
    g = torch.Generator().manual_seed(0)
    ids = _sorted_ids(L_MEM, 8, g)
    sizes = torch.bincount(ids).tolist()
    watch = _Watch(monkeypatch)
    q, k, v = inputs((1, 2), L_MEM, 8)
    F.scaled_dot_product_attention(q, k, v, M.document(ids), backend="blocksparse")
    assert sorted((r, c) for _, r, c in watch.calls) == sorted((s, s) for s in sizes if s)


def test_backward_saves_o_l_memory():
    """Everything autograd keeps for the backward is O(L * d), never an L x L tile."""
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    n, d = 4, 8
    cases = (
        (M.sliding_window(W_MEM), "blocksparse", L_MEM),
        (M.prefix_lm(64) & M.sliding_window(W_MEM, 0), "blocksparse", L_MEM),
        (M.sliding_window(W_MEM), "math", 1024),
    )
    for mask, backend, lq in cases:
        saved.clear()
        q, k, v = inputs((1, n), lq, d)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = F.scaled_dot_product_attention(q, k, v, mask, backend=backend)
        out.sum().backward()
        bound = 8 * n * (lq + bs.BLOCK_Q) * d + n * lq  # q, k, v, padded copies, out, lse
        if backend == "math":  # the check can fail: the math backend keeps the L x L weights
            assert max(saved) >= n * lq * lq
        else:
            assert sum(saved) <= bound, (mask, sum(saved), bound)

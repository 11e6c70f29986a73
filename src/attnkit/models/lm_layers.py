"""The parts of a :class:`~attnkit.models.lm.TransformerLM` below the model: the layer that also
takes a KV cache (:class:`CausalLayer`), the per-layer caches of a decoding session
(:class:`LMCache`) and the LM's attention function (:func:`float32_attention`).

Shape legend: ``B`` batch, ``L`` sequence length (new tokens when a cache is used), ``E`` d_model.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnkit.nn.attention_fn import default_attention
from attnkit.nn.cache import KVCache
from attnkit.nn.transformer import TransformerEncoderLayer

__all__ = ["CausalLayer", "LMCache", "float32_attention"]


def float32_attention(q: Tensor, k: Tensor, v: Tensor, mask=None, **kw):
    """The LM's ``attention_fn`` (:data:`attnkit.nn.attention_fn.AttentionFn`): the default
    attention, but bfloat16/float16 CPU inputs (bf16 autocast, ``--bf16``) are attended in
    float32 and the output cast back. PyTorch's fused CPU attention is far slower in bf16 at
    language-model lengths (fwd + bwd, B 12, 4 heads, L 64, d 32, one thread: 43 ms in bf16,
    1.6 ms in float32), while the projections around it gain from bf16."""
    low = q.dtype in (torch.bfloat16, torch.float16) and q.device.type == "cpu"
    if not low:
        return default_attention(q, k, v, mask, **kw)
    with torch.autocast("cpu", enabled=False):
        out, w = default_attention(q.float(), k.float(), v.float(), mask, **kw)
    return out.to(q.dtype), (None if w is None else w.to(q.dtype))


class CausalLayer(TransformerEncoderLayer):
    """An encoder layer (self-attention + feed-forward) whose forward also takes a
    self-attention :class:`~attnkit.nn.cache.KVCache`: with one, ``src`` holds only the new
    tokens, their keys/values are appended, and ``mask`` covers (L, L_all)."""

    def forward(self, src: Tensor, mask=None, cache: KVCache | None = None) -> Tensor:
        """src (B, L, E) -> (B, L, E); mask True = may attend."""
        if cache is None:
            return super().forward(src, mask)
        x = src
        if self.norm_first:
            x = x + self._cached_sa(self.norm1(x), mask, cache)
            x = x + self.dropout2(self._ff_block(self.norm2(x)))
        else:
            x = self.norm1(x + self._cached_sa(x, mask, cache))
            x = self.norm2(x + self.dropout2(self._ff_block(x)))
        return x

    def _cached_sa(self, x: Tensor, mask, cache: KVCache) -> Tensor:
        return self.dropout1(self.self_attn(x, mask=mask, cache=cache)[0])

    def checkpointed(self, src: Tensor, mask=None) -> Tensor:
        """``forward(src, mask)`` (B, L, E) -> (B, L, E) with each sub-block (self-attention,
        feed-forward) under ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved):
        only the two sub-blocks' inputs are kept for the backward pass, which recomputes one
        sub-block at a time."""
        x = self.check_inputs(src, mask)
        if self.norm_first:
            x = x + checkpoint(self._pre_attention, x, mask, use_reentrant=False)
            return x + checkpoint(self._pre_feed_forward, x, use_reentrant=False)
        x = checkpoint(self._post_attention, x, mask, use_reentrant=False)
        return checkpoint(self._post_feed_forward, x, use_reentrant=False)

    def _pre_attention(self, x: Tensor, mask) -> Tensor:
        return self._sa_block(self.norm1(x), mask, False)[0]

    def _pre_feed_forward(self, x: Tensor) -> Tensor:
        return self.dropout2(self._ff_block(self.norm2(x)))

    def _post_attention(self, x: Tensor, mask) -> Tensor:
        return self.norm1(x + self._sa_block(x, mask, False)[0])

    def _post_feed_forward(self, x: Tensor) -> Tensor:
        return self.norm2(x + self.dropout2(self._ff_block(x)))


class LMCache:
    """One self-attention :class:`~attnkit.nn.cache.KVCache` per layer of a TransformerLM."""

    def __init__(self, layers: list[KVCache]) -> None:
        self.layers = layers

    @property
    def length(self) -> int:
        """Number of positions processed so far."""
        return self.layers[0].seen

    def reorder(self, index: Tensor) -> None:
        """Select batch rows of every layer's cache; index (B',)."""
        for c in self.layers:
            c.reorder(index)

    def keep_last(self, n: int) -> None:
        """Drop all but the last ``n`` cached keys and values of every layer (a local-causal
        model with window n never reads older ones; :attr:`length` is unchanged)."""
        for c in self.layers:
            if c.k is not None and c.k.shape[-2] > n:
                c.k, c.v = c.k[..., c.k.shape[-2] - n :, :], c.v[..., c.v.shape[-2] - n :, :]

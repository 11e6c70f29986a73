"""Key/value caches for incremental (token-by-token) decoding.

Shape legend
------------
``B``  batch          ``G``  key/value heads (``num_kv_heads``; G = H without grouping)
``L``  cached key positions          ``dk``, ``dv``  per-head key / value widths

Two kinds of cache, one class:

* a **self-attention** cache (``static=False``) grows at every call: the keys and values of the
  new tokens are appended and the queries attend over everything cached so far;
* a **cross-attention** cache (``static=True``) is filled once from the encoder memory at the
  first call and reused unchanged afterwards (the memory does not change while decoding).

A cache belongs to the first attention module that uses it (or the one that created it with
:meth:`~attnkit.nn.attention.MultiHeadAttention.new_cache`); handing it to another module raises
``ValueError``. A decoder keeps one :class:`DecoderLayerCache` per layer in a
:class:`DecoderCache`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

__all__ = ["DecoderCache", "DecoderLayerCache", "KVCache"]


@dataclass(eq=False)
class KVCache:
    """Cached keys and values of one attention module.

    Attributes:
        static: False for a self-attention cache (appends), True for a cross-attention cache
            (filled once, then reused).
        k: (B, G, L, dk) cached keys (after any rotary embedding), or None while empty.
        v: (B, G, L, dv) cached values, or None while empty.
        seen: number of query positions already processed through this cache; the position of
            the next query token (used as the rotary offset).
        owner_id: ``id()`` of the owning attention module, None until first use.
    """

    static: bool = False
    k: Tensor | None = None
    v: Tensor | None = None
    seen: int = 0
    owner_id: int | None = None
    _owner: weakref.ref | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        """Number of cached key positions L (0 while empty)."""
        return 0 if self.k is None else int(self.k.shape[-2])

    @property
    def is_empty(self) -> bool:
        return self.k is None

    def claim(self, module: nn.Module) -> None:
        """Make ``module`` the owner, or raise ``ValueError`` if another module owns the cache."""
        owner = None if self._owner is None else self._owner()
        if owner is module:
            return
        if self._owner is not None:
            raise ValueError(
                f"cache: this KVCache belongs to another attention module "
                f"(id {self.owner_id:#x}), not to {type(module).__name__} (id {id(module):#x}); "
                "give every attention module its own cache (e.g. TransformerDecoder.new_cache())"
            )
        self._owner = weakref.ref(module)
        self.owner_id = id(module)

    def concat(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The cached keys/values followed by new ones (B, G, Ln, dk) / (B, G, Ln, dv):
        (B, G, L + Ln, dk) and (B, G, L + Ln, dv). Nothing is stored (see :meth:`store`)."""
        if self.static:
            raise ValueError("cache: a static (cross-attention) cache cannot be appended to")
        if self.k is None:
            return k, v
        for name, new, old in (("key", k, self.k), ("value", v, self.v)):
            if new.shape[:2] != old.shape[:2] or new.shape[-1] != old.shape[-1]:
                raise ValueError(
                    f"cache: the new {name}s have shape {tuple(new.shape)} (B, G, Ln, d) but "
                    f"the cached ones {tuple(old.shape)}; batch, heads and width must match"
                )
        return torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)

    def store(self, k: Tensor, v: Tensor, q_len: int) -> None:
        """Keep k (B, G, L, dk) and v (B, G, L, dv) as the cache's content and count ``q_len``
        more queries as seen. For a static cache, k and v are the memory's projections."""
        self.k, self.v = k, v
        self.seen += q_len

    def append(self, k: Tensor, v: Tensor, q_len: int) -> tuple[Tensor, Tensor]:
        """Append new keys (B, G, Ln, dk) and values (B, G, Ln, dv); return everything cached,
        (B, G, L + Ln, dk) and (B, G, L + Ln, dv). ``q_len`` queries are counted as seen."""
        k, v = self.concat(k, v)
        self.store(k, v, q_len)
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): ``k = k[index]``, ``v = v[index]``; index (B',)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index.to(self.k.device))
            self.v = self.v.index_select(0, index.to(self.v.device))

    def reset(self) -> None:
        """Forget the cached keys and values (ownership is kept)."""
        self.k = self.v = None
        self.seen = 0


@dataclass(eq=False)
class DecoderLayerCache:
    """Caches of one decoder layer: its self-attention (growing) and cross-attention (static)."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=lambda: KVCache(static=True))

    def reorder(self, index: Tensor) -> None:
        self.self_attn.reorder(index)
        self.cross_attn.reorder(index)


@dataclass(eq=False)
class DecoderCache:
    """One :class:`DecoderLayerCache` per decoder layer, in layer order."""

    layers: list[DecoderLayerCache]

    @classmethod
    def empty(cls, num_layers: int) -> DecoderCache:
        """Unclaimed caches for ``num_layers`` layers (each claimed by its layer on first use)."""
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers: expected a positive int, got {num_layers!r}")
        return cls([DecoderLayerCache() for _ in range(num_layers)])

    @property
    def length(self) -> int:
        """Number of target positions decoded so far."""
        return self.layers[0].self_attn.seen if self.layers else 0

    def reorder(self, index: Tensor) -> None:
        """Select batch rows of every cache (beam search); index (B',)."""
        for layer in self.layers:
            layer.reorder(index)

    def reset(self) -> None:
        for layer in self.layers:
            layer.self_attn.reset()
            layer.cross_attn.reset()

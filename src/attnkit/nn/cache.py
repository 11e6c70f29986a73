"""Key/value caches for incremental (token-by-token) decoding.

Shape legend
------------
``B``  batch          ``G``  key/value heads (``num_kv_heads``; G = H without grouping)
``L``  cached key positions          ``dk``, ``dv``  per-head key / value widths
``Lq`` new query positions           ``Ln`` new key positions

Two kinds of cache, one class:

* a **self-attention** cache (``static=False``) grows at every call: the keys and values of the
  new tokens are appended and the queries attend over everything cached so far;
* a **cross-attention** cache (``static=True``) is filled once from the encoder memory at the
  first call and reused unchanged afterwards (the memory does not change while decoding).

The cache owns its rules (like torchtune's ``KVCache``, whose API is update / reset / size):
:meth:`KVCache.check` refuses a call that cannot be right before any work (another owner, another
batch size, a static cache with other keys, a mask whose alignment would hide or misplace the
cached keys), :meth:`KVCache.positions` gives the rotary offsets, :meth:`KVCache.update` appends
and returns everything cached. A cache belongs to the first attention module that uses it (or
the one that created it with :meth:`~attnkit.nn.attention.MultiHeadAttention.new_cache`). A
decoder keeps one :class:`DecoderLayerCache` per layer in a :class:`DecoderCache`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit.masks import Mask

__all__ = ["DecoderCache", "DecoderLayerCache", "KVCache", "check_index"]


def check_index(index: object, batch: int | None, name: str = "index") -> Tensor:
    """``index`` as a 1-d int64 tensor of batch rows in [0, batch) (beam search reordering).

    TypeError for a non-tensor (a list included), a float or bool tensor; ValueError for another
    number of dims, an empty index, or rows out of range (negative rows are refused too)."""
    if not isinstance(index, Tensor):
        raise TypeError(
            f"{name}: expected a 1-d integer torch.Tensor of batch rows, "
            f"got {checks.show(index)} ({type(index).__name__})"
        )
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise TypeError(
            f"{name}: expected an integer tensor of batch rows, got dtype {index.dtype}"
        )
    if index.dim() != 1 or index.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty 1-d tensor (B',), got {tuple(index.shape)}")
    lo, hi = int(index.min()), int(index.max())
    if lo < 0 or (batch is not None and hi >= batch):
        bound = f"[0, {batch})" if batch is not None else ">= 0"
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name}: expected batch rows in {bound}, got {bad}")
    return index.to(torch.long)


def _position_dependent(mask: object) -> list[Mask]:
    """The leaves of ``mask`` that compare query and key positions (have an alignment)."""
    if not isinstance(mask, Mask):
        return []
    return [m for m in mask.leaves() if m.alignment is not None]


@dataclass(eq=False)
class KVCache:
    """Cached keys and values of one attention module.

    Attributes:
        static: False for a self-attention cache (appends), True for a cross-attention cache
            (filled once, then reused).
        k: (B, G, L, dk) cached keys (after any rotary embedding), or None while empty.
        v: (B, G, L, dv) cached values, or None while empty.
        seen: number of query positions already processed through this cache; the position of
            the next query token.
        owner_id: ``id()`` of the owning attention module, None until first use.
    """

    static: bool = False
    k: Tensor | None = None
    v: Tensor | None = None
    seen: int = 0
    owner_id: int | None = None
    _owner: weakref.ref | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.static = checks.flag("static", self.static)

    @property
    def size(self) -> int:
        """Number of cached key positions L (0 while empty)."""
        return 0 if self.k is None else int(self.k.shape[-2])

    @property
    def length(self) -> int:
        """Same as :attr:`size`."""
        return self.size

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

    def check(
        self,
        module: nn.Module,
        batch: int,
        mask: object = None,
        kv_len: int | None = None,
        rotary: bool = False,
    ) -> None:
        """Every cache rule for a call of ``module`` with ``batch`` rows, before any work.

        Claims the cache for ``module``; ``kv_len`` is the number of keys passed to a static
        cache that is already filled (None when they are omitted). With cached keys, a mask
        part that compares positions must be bottom-right aligned (the new queries come after
        the cached keys); after the first call of a static cache no such part is allowed (its
        query positions restart at every call). Raises ValueError naming the argument.
        """
        self.claim(module)
        if self.static and rotary:
            raise ValueError(
                "cache: a static (cross-attention) cache cannot be used with rotary; "
                "rotary embeddings apply to self-attention"
            )
        if self.k is not None and self.k.shape[0] != batch:
            raise ValueError(
                f"cache: holds batch size {self.k.shape[0]}, but query has B = {batch}"
            )
        if self.static and self.k is not None and kv_len is not None and kv_len != self.size:
            raise ValueError(
                f"key: the static cache holds Lk = {self.size} keys, got {kv_len} key positions"
            )
        self._check_alignment(mask)

    def _check_alignment(self, mask: object) -> None:
        parts = _position_dependent(mask)
        if self.static and self.seen and parts:
            raise ValueError(
                f"mask: {parts[0]!r} compares query and key positions, but a static "
                "(cross-attention) cache restarts the query positions at every call; mask the "
                "memory with key_padding / from_key_padding_mask or an explicit tensor"
            )
        if not self.static and self.size:
            for m in parts:
                if m.alignment == "top_left":
                    raise ValueError(
                        f"mask: {m!r} is top-left aligned; with {self.size} cached keys it would "
                        "compare the new queries with the first keys instead of the last; build "
                        "it with alignment='bottom_right' (e.g. causal('bottom_right'))"
                    )

    def positions(self) -> tuple[int, int]:
        """(position of the first new query, position of the first new key): the offsets a
        rotary embedding needs; (seen, size)."""
        return self.seen, self.size

    def update(self, k: Tensor | None, v: Tensor | None, q_len: int) -> tuple[Tensor, Tensor]:
        """Add new keys (B, G, Ln, dk) and values (B, G, Ln, dv) and count ``q_len`` queries as
        seen; return everything cached, (B, G, L + Ln, dk) and (B, G, L + Ln, dv).

        A static cache stores k and v at its first update and afterwards returns them
        unchanged (pass None for k and v then)."""
        q_len = checks.nonnegative_int("q_len", q_len)
        if self.static and self.k is not None:
            self.seen += q_len
            return self.k, self.v
        if k is None or v is None:
            raise ValueError("cache: expected new keys and values for an empty or growing cache")
        if self.k is not None:
            for name, new, old in (("key", k, self.k), ("value", v, self.v)):
                if new.shape[:2] != old.shape[:2] or new.shape[-1] != old.shape[-1]:
                    raise ValueError(
                        f"cache: the new {name}s have shape {tuple(new.shape)} (B, G, Ln, d) but "
                        f"the cached ones {tuple(old.shape)}; batch, heads and width must match"
                    )
            k, v = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
        self.k, self.v = k, v
        self.seen += q_len
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): ``k = k[index]``, ``v = v[index]``; index (B',)
        int64 rows in [0, B) (TypeError / ValueError otherwise, see :func:`check_index`)."""
        index = check_index(index, None if self.k is None else int(self.k.shape[0]))
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
        """Select batch rows of both caches; index (B',)."""
        self.self_attn.reorder(index)
        self.cross_attn.reorder(index)


@dataclass(eq=False)
class DecoderCache:
    """One :class:`DecoderLayerCache` per decoder layer, in layer order."""

    layers: list[DecoderLayerCache]

    @classmethod
    def empty(cls, num_layers: int) -> DecoderCache:
        """Unclaimed caches for ``num_layers`` layers (each claimed by its layer on first use)."""
        num_layers = checks.positive_int("num_layers", num_layers)
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
        """Forget every cached key and value."""
        for layer in self.layers:
            layer.self_attn.reset()
            layer.cross_attn.reset()

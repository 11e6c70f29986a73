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
from attnkit import tensor_checks as tc
from attnkit.kernels.policy import kv_bounds, numerics
from attnkit.kernels.policy.kv_bounds import RowBounds
from attnkit.masks import Mask

__all__ = ["GROWTH", "DecoderCache", "DecoderLayerCache", "KVCache", "check_index"]

GROWTH = 1.5
"""A growing cache's buffer is enlarged to this many times the positions it must hold (at least
MIN_ROOM more): appending a token then writes one row instead of copying the whole cache."""
MIN_ROOM = 64


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
    _rows: RowBounds | None = field(default=None, repr=False)
    """max|k| and finiteness per batch row of what is cached (:class:`RowBounds`)."""
    _handed: tuple[Tensor, Tensor] | None = field(default=None, repr=False)
    """The (k, v) the last update returned: when ``k``/``v`` are not these, they were set from
    outside and the bounds are recomputed."""
    _buffers: tuple[Tensor, Tensor] | None = field(default=None, repr=False)
    """(B, G, capacity, d) buffers that ``k`` and ``v`` are views of (None: not views)."""

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
        """Make ``module`` the owner, or raise ``ValueError`` if another module owns the cache
        (``TypeError`` when ``module`` is not a ``torch.nn.Module``)."""
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"module: expected the torch.nn.Module that uses this cache, "
                f"got {checks.show(module)} ({type(module).__name__})"
            )
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
                        f"mask: {m!r} is top-left aligned; with {self.size} cached "
                        f"key{'s' if self.size != 1 else ''} it would "
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
        unchanged (pass None for k and v then). A growing cache writes the new rows into a
        buffer with room to spare (:data:`GROWTH`) and returns views of it, unless gradients
        flow through the cache (then it concatenates). It keeps max|k| and the finiteness of k
        and v per batch row, from the new rows only, for the overflow policy
        (:mod:`attnkit.kernels.policy.kv_bounds`). TypeError / ValueError naming ``k``, ``v`` or
        ``q_len`` for bad input, before the cache changes."""
        q_len = checks.nonnegative_int("q_len", q_len)
        if self.static and self.k is not None:
            self.seen += q_len
            return self.k, self.v
        if k is None or v is None:
            raise ValueError("cache: expected new keys and values for an empty or growing cache")
        self._check_new(k, v)
        rows = self._row_bounds()
        host = not numerics.device_path(k.device)
        if self.k is None:
            self.k, self.v = k, v
            self._rows = RowBounds.of(k, v, host)
        else:
            self._rows = rows.extend(k, v, host)
            self.k, self.v = self._append(k, v)
        self._handed = (self.k, self.v)
        self._remember()
        self.seen += q_len
        return self.k, self.v

    def _remember(self) -> None:
        """Hand the policy the bounds of what is cached (:func:`kv_bounds.remember`), on the
        host path only: the policy's device path reads no bounds, and reading them would be a
        host sync (the per-row bounds stay on the device until :meth:`bounds` is asked)."""
        if not numerics.device_path(self.k.device):
            kv_bounds.remember(self.k, self.v, self._rows.bounds())

    def _check_new(self, k: object, v: object) -> None:
        """New keys and values: floating 4-d tensors (B, G, Ln, d) with one Ln, and the batch,
        heads, widths, dtype and device of what is cached."""
        k, v = tc.floating_tensor("k", k), tc.floating_tensor("v", v)
        tc.like("v", v, k, "k")
        for name, t, d in (("k", k, "dk"), ("v", v, "dv")):
            if t.dim() != 4:
                raise ValueError(
                    f"{name}: expected 4 dims (B, G, Ln, {d}), got shape {tuple(t.shape)}"
                )
            if 0 in (t.shape[0], t.shape[1], t.shape[3]):
                raise ValueError(
                    f"{name}: expected B, G and {d} of (B, G, Ln, {d}) to be at least 1, "
                    f"got shape {tuple(t.shape)}"
                )
        if v.shape[:3] != k.shape[:3]:
            raise ValueError(
                f"v: expected (B, G, Ln) = {tuple(k.shape[:3])} like k, got {tuple(v.shape)}"
            )
        if self.k is None:
            return
        for name, new, old in (("k", k, self.k), ("v", v, self.v)):
            tc.like(name, new, old, "the cached " + ("keys" if name == "k" else "values"))
            if new.shape[:2] != old.shape[:2] or new.shape[-1] != old.shape[-1]:
                raise ValueError(
                    f"{name}: the new {'key' if name == 'k' else 'value'}s have shape "
                    f"{tuple(new.shape)} (B, G, Ln, d) but the cached ones {tuple(old.shape)}; "
                    "batch, heads and width must match"
                )

    def _row_bounds(self) -> RowBounds | None:
        """The per-row bounds of what is cached; recomputed (one scan) when k or v were set
        from outside since the last update (e.g. ``LMCache.keep_last``)."""
        if self.k is None:
            return None
        handed, rows = self._handed, self._rows
        if rows is None or handed is None or handed[0] is not self.k or handed[1] is not self.v:
            host = not numerics.device_path(self.k.device)
            rows = self._rows = RowBounds.of(self.k, self.v, host)
            self._buffers = None  # not views of our buffers any more
        return rows

    def _append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Everything cached with k, v appended: views of the buffers (grown when full), or a
        concatenation when gradients flow through the cache."""
        old_k, old_v = self.k, self.v
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (k, v, old_k, old_v))
        if grad:
            return torch.cat([old_k, k], dim=-2), torch.cat([old_v, v], dim=-2)
        n, m = old_k.shape[-2], old_k.shape[-2] + k.shape[-2]
        bufs = self._buffers
        if (
            bufs is None
            or bufs[0].shape[-2] < m
            or (bufs[0].is_inference() and not torch.is_inference_mode_enabled())
        ):
            room = max(m + MIN_ROOM, int(m * GROWTH))
            bufs = tuple(t.new_empty(t.shape[:2] + (room, t.shape[-1])) for t in (old_k, old_v))
            bufs[0][:, :, :n].copy_(old_k)
            bufs[1][:, :, :n].copy_(old_v)
            self._buffers = bufs
        bufs[0][:, :, n:m].copy_(k)
        bufs[1][:, :, n:m].copy_(v)
        return bufs[0][:, :, :m], bufs[1][:, :, :m]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search): ``k = k[index]``, ``v = v[index]``; index (B',)
        int64 rows in [0, B) (TypeError / ValueError otherwise, see :func:`check_index`). The
        kept bounds are selected with them (exact)."""
        index = check_index(index, None if self.k is None else int(self.k.shape[0]))
        if self.k is not None:
            rows = self._row_bounds().select(index.to(self.k.device))
            self.k = self.k.index_select(0, index.to(self.k.device))
            self.v = self.v.index_select(0, index.to(self.v.device))
            self._rows, self._handed, self._buffers = rows, (self.k, self.v), None
            self._remember()

    def bounds(self) -> kv_bounds.KVBounds | None:
        """max|k| and the finiteness of k and v over everything cached (None while empty), as
        the overflow policy reads them; kept from the appended rows, never a full scan."""
        rows = self._row_bounds()
        return None if rows is None else rows.bounds()

    def reset(self) -> None:
        """Forget the cached keys and values (ownership is kept)."""
        self.k = self.v = None
        self.seen = 0
        self._rows = self._handed = self._buffers = None


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

"""Multi-head attention as a module (seed 001):

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O
    head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i)

Self-attention is ``MultiHead(X, X, X)``: call the module with the query alone.

Shape legend
------------
``B``  batch            ``Lq``  query length        ``Lk``  key length (cached keys included)
``E``  embed_dim        ``E_k`` kdim                ``E_v`` vdim
``H``  num_heads        ``G``   num_kv_heads (divides H; G < H is grouped-query, G = 1
                                multi-query attention)
``d``  head width E / H

Inputs are (B, L, E) with ``batch_first=True`` (the default) and (L, B, E) otherwise; attention
weights are always (B, H, Lq, Lk) (or (B, Lq, Lk) averaged over heads).

Masks: **True = may attend** (see :mod:`attnkit.masks`). A mask object (``causal()``,
``key_padding(lengths)``, ``from_key_padding_mask(torch_style_padding)``, ...) or a tensor
broadcastable to (B, H, Lq, Lk) with right-aligned torch rules ((Lq, Lk), (B, 1, Lq, Lk), ...).
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor, nn

from attnkit import functional
from attnkit.masks import Mask, causal
from attnkit.nn.cache import KVCache

__all__ = ["MultiHeadAttention"]


def _positive_int(name: str, x: object) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name}: expected a positive int, got {x!r}")
    return x


def _split_heads(x: Tensor, n: int) -> Tensor:
    """(B, L, n*d) -> (B, n, L, d)."""
    b, length, e = x.shape
    return x.reshape(b, length, n, e // n).transpose(1, 2)


def _has_top_left_causal(mask: object) -> bool:
    """True when ``mask`` is, or combines with & / |, a top-left aligned causal mask."""
    if isinstance(mask, causal):
        return mask.alignment == "top_left"
    parts = [getattr(mask, "a", None), getattr(mask, "b", None)]
    return any(isinstance(p, Mask) and _has_top_left_causal(p) for p in parts)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with optional grouped-query heads, rotary embeddings and a KV cache.

    Args:
        embed_dim: E, width of the query and of the output; divisible by ``num_heads``.
        num_heads: H query heads, each of width d = E / H.
        kdim: E_k, width of the key input (default E).
        vdim: E_v, width of the value input (default E).
        num_kv_heads: G key/value heads (default H); must divide H. Query head h uses key/value
            head h // (H / G) (grouped-query attention; G = 1 is multi-query attention).
        bias: biases on all four projections.
        dropout: dropout probability on the attention weights (training mode only).
        batch_first: inputs and outputs are (B, L, E) when True, (L, B, E) when False.
        rotary: optional module called as ``q, k = rotary(q, k, q_offset, k_offset)`` on
            q (B, H, Lq, d) and k (B, G, Lk_new, d) after the head split; the offsets are the
            positions already in the cache (0 without one).

    Parameters are four ``nn.Linear``: ``q_proj`` (E -> H d), ``k_proj`` (E_k -> G d),
    ``v_proj`` (E_v -> G d), ``out_proj`` (H d -> E).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        num_kv_heads: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        batch_first: bool = True,
        rotary: nn.Module | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        embed_dim = _positive_int("embed_dim", embed_dim)
        num_heads = _positive_int("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim: expected a multiple of num_heads={num_heads}, got {embed_dim}"
            )
        kdim = embed_dim if kdim is None else _positive_int("kdim", kdim)
        vdim = embed_dim if vdim is None else _positive_int("vdim", vdim)
        g = num_heads if num_kv_heads is None else _positive_int("num_kv_heads", num_kv_heads)
        if num_heads % g:
            raise ValueError(
                f"num_kv_heads: expected a divisor of num_heads={num_heads}, got {num_kv_heads}"
            )
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, numbers.Real)
            or not 0.0 <= float(dropout) < 1.0
        ):
            raise ValueError(f"dropout: expected a number in [0, 1), got {dropout!r}")
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first: expected a bool, got {batch_first!r}")
        if rotary is not None and not callable(rotary):
            raise TypeError(f"rotary: expected a callable module or None, got {type(rotary)}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, g
        self.kdim, self.vdim = kdim, vdim
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.batch_first = batch_first
        self.rotary = rotary
        kw = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(kdim, g * self.head_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(vdim, g * self.head_dim, bias=bias, **kw)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)

    @property
    def bias(self) -> bool:
        return self.q_proj.bias is not None

    def extra_repr(self) -> str:
        s = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
        if self.num_kv_heads != self.num_heads:
            s += f", num_kv_heads={self.num_kv_heads}"
        if (self.kdim, self.vdim) != (self.embed_dim, self.embed_dim):
            s += f", kdim={self.kdim}, vdim={self.vdim}"
        return s + f", dropout={self.dropout}, batch_first={self.batch_first}"

    def new_cache(self, static: bool = False) -> KVCache:
        """An empty cache owned by this module: ``static=False`` for self-attention (grows each
        call), ``static=True`` for cross-attention (filled from the memory once)."""
        c = KVCache(static=static)
        c.claim(self)
        return c

    # -----------------------------------------------------------------------------------------
    def _check_input(self, name: str, x: object, width: int, width_name: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        layout = "(B, L, E)" if self.batch_first else "(L, B, E)"
        if x.dim() != 3:
            raise ValueError(f"{name}: expected 3 dims {layout}, got shape {tuple(x.shape)}")
        if x.shape[-1] != width:
            raise ValueError(
                f"{name}: expected last dim {width_name}={width}, got shape {tuple(x.shape)}"
            )
        w = self.q_proj.weight
        if x.dtype != w.dtype:
            raise TypeError(f"{name}: expected dtype {w.dtype} like the parameters, got {x.dtype}")
        if 0 in x.shape:
            raise ValueError(f"{name}: expected non-empty dims, got shape {tuple(x.shape)}")
        return x if self.batch_first else x.transpose(0, 1)

    def _check_mask(self, mask: object) -> None:
        if isinstance(mask, Tensor) and mask.dim() == 3:
            raise ValueError(
                f"mask: a 3-D tensor {tuple(mask.shape)} is ambiguous against (B, H, Lq, Lk); "
                "give (Lq, Lk), (B, 1, Lq, Lk), or a per-batch mask as "
                "attnkit.masks.from_tensor(mask) (leading dim = B)"
            )

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Mask | Tensor | None = None,
        *,
        return_weights: bool = False,
        average_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (B, Lq, E) (or (Lq, B, E) when ``batch_first=False``).
            key: (B, Lk, E_k); defaults to ``query`` (self-attention).
            value: (B, Lk, E_v); defaults to ``key``.
            mask: True = may attend; mask object or tensor broadcastable to (B, H, Lq, Lk),
                where Lk counts the cached keys too. With a self-attention cache use
                ``causal("bottom_right")`` (equal to ``causal()`` when nothing is cached).
            return_weights: also return the attention weights (B, H, Lq, Lk) (before dropout);
                this uses the plain math backend. Otherwise the fastest backend runs.
            average_weights: average the returned weights over heads: (B, Lq, Lk).
            cache: a :class:`~attnkit.nn.cache.KVCache`. Self-attention cache: the keys and
                values of this call are appended and the queries attend over all cached
                positions. Static (cross-attention) cache: keys/values are projected from
                ``key``/``value`` on the first call and reused afterwards (later calls may
                omit ``key`` and ``value``).

        Returns:
            (output (B, Lq, E) (or (Lq, B, E)), weights or None).
        """
        if not isinstance(return_weights, bool):
            raise TypeError(f"return_weights: expected a bool, got {return_weights!r}")
        if not isinstance(average_weights, bool):
            raise TypeError(f"average_weights: expected a bool, got {average_weights!r}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache: expected a KVCache or None, got {type(cache).__name__}")
        # a filled static cache needs no key/value: they were projected at the first call
        reuse = cache is not None and cache.static and cache.k is not None
        skip_kv = reuse and key is None and value is None
        key = query if key is None else key
        value = key if value is None else value
        query = self._check_input("query", query, self.embed_dim, "embed_dim")
        b, lq, _ = query.shape
        if not skip_kv:
            key = self._check_input("key", key, self.kdim, "kdim")
            value = self._check_input("value", value, self.vdim, "vdim")
            if key.shape[0] != b or value.shape[:2] != key.shape[:2]:
                raise ValueError(
                    f"key/value: expected (B, Lk, .) with B = {b} like query and the same Lk, "
                    f"got key {tuple(key.shape)}, value {tuple(value.shape)} (batch first)"
                )
        self._check_mask(mask)
        if cache is not None:
            cache.claim(self)
            if cache.static and self.rotary is not None:
                raise ValueError(
                    "cache: a static (cross-attention) cache cannot be used with rotary; "
                    "rotary embeddings apply to self-attention"
                )
            if cache.k is not None and cache.k.shape[0] != b:
                raise ValueError(
                    f"cache: holds batch size {cache.k.shape[0]}, but query has B = {b}"
                )
            if not cache.static and cache.length and _has_top_left_causal(mask):
                raise ValueError(
                    f"mask: a top-left causal mask with {cache.length} cached keys would hide "
                    "them from the new queries; use causal('bottom_right')"
                )
            if reuse and not skip_kv and key.shape[1] != cache.length:
                raise ValueError(
                    f"key: the static cache holds Lk = {cache.length} keys, got key "
                    f"{tuple(key.shape)} (batch first)"
                )

        q = _split_heads(self.q_proj(query), self.num_heads)  # (B, H, Lq, d)
        if reuse:
            k, v = cache.k, cache.v
        else:
            k = _split_heads(self.k_proj(key), self.num_kv_heads)  # (B, G, Lk, d)
            v = _split_heads(self.v_proj(value), self.num_kv_heads)  # (B, G, Lk, d)
            if self.rotary is not None:
                q_off = 0 if cache is None else cache.seen
                k_off = 0 if cache is None else cache.length
                q, k = self.rotary(q, k, q_off, k_off)
            if cache is not None and not cache.static:
                k, v = cache.concat(k, v)  # (B, G, L_cached + Lk, d)
        cached_k, cached_v = k, v
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(rep, dim=1)  # (B, H, Lk, d)
            v = v.repeat_interleave(rep, dim=1)
        res = functional.scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            dropout_p=self.dropout if self.training else 0.0,
            return_weights=return_weights,
        )
        out, weights = res if return_weights else (res, None)
        if cache is not None:  # only now: a call that raised leaves the cache unchanged
            cache.store(cached_k, cached_v, lq)
        out = self.out_proj(out.transpose(1, 2).reshape(b, lq, self.embed_dim))  # (B, Lq, E)
        if weights is not None and average_weights:
            weights = weights.mean(dim=1)
        return (out if self.batch_first else out.transpose(0, 1)), weights

    # -----------------------------------------------------------------------------------------
    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy a ``torch.nn.MultiheadAttention`` (packed ``in_proj_weight`` or separate
        ``q/k/v_proj_weight``, with or without bias, either ``batch_first``).

        ``add_bias_kv`` and ``add_zero_attn`` have no counterpart here and raise ``ValueError``.
        torch's masks map to attnkit masks through the named converters: ``key_padding_mask``
        (True = ignore) -> ``masks.from_key_padding_mask(kpm)``; a bool ``attn_mask`` (True =
        NOT allowed) -> ``masks.from_tensor(~attn_mask)``; a float ``attn_mask`` ->
        ``masks.from_additive(attn_mask)``.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"m: expected a torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.bias_v is not None:
            raise ValueError("m: add_bias_kv=True is not supported by attnkit's MultiHeadAttention")
        if m.add_zero_attn:
            raise ValueError(
                "m: add_zero_attn=True is not supported by attnkit's MultiHeadAttention"
            )
        w0 = m.out_proj.weight
        new = cls(
            m.embed_dim,
            m.num_heads,
            kdim=m.kdim,
            vdim=m.vdim,
            bias=m.in_proj_bias is not None,
            dropout=m.dropout,
            batch_first=m.batch_first,
            device=w0.device,
            dtype=w0.dtype,
        )
        e = m.embed_dim
        if m._qkv_same_embed_dim:
            wq, wk, wv = m.in_proj_weight.detach().split(e, dim=0)
        else:
            wq, wk, wv = (t.detach() for t in (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight))
        with torch.no_grad():
            new.q_proj.weight.copy_(wq)
            new.k_proj.weight.copy_(wk)
            new.v_proj.weight.copy_(wv)
            new.out_proj.weight.copy_(m.out_proj.weight)
            if m.in_proj_bias is not None:
                bq, bk, bv = m.in_proj_bias.detach().split(e, dim=0)
                new.q_proj.bias.copy_(bq)
                new.k_proj.bias.copy_(bk)
                new.v_proj.bias.copy_(bv)
                new.out_proj.bias.copy_(m.out_proj.bias)
        new.train(m.training)
        return new

    def to_torch(self) -> nn.MultiheadAttention:
        """The equivalent ``torch.nn.MultiheadAttention`` (same weights). Only for
        ``num_kv_heads == num_heads`` and no rotary embedding (torch has neither)."""
        if self.num_kv_heads != self.num_heads:
            raise ValueError(
                f"num_kv_heads: torch.nn.MultiheadAttention has no grouped-query heads "
                f"(num_kv_heads={self.num_kv_heads} != num_heads={self.num_heads})"
            )
        if self.rotary is not None:
            raise ValueError("rotary: torch.nn.MultiheadAttention has no rotary embedding")
        w0 = self.q_proj.weight
        m = nn.MultiheadAttention(
            self.embed_dim,
            self.num_heads,
            dropout=self.dropout,
            bias=self.bias,
            kdim=self.kdim,
            vdim=self.vdim,
            batch_first=self.batch_first,
            device=w0.device,
            dtype=w0.dtype,
        )
        with torch.no_grad():
            ws = [p.weight for p in (self.q_proj, self.k_proj, self.v_proj)]
            if m._qkv_same_embed_dim:
                m.in_proj_weight.copy_(torch.cat(ws, dim=0))
            else:
                m.q_proj_weight.copy_(ws[0])
                m.k_proj_weight.copy_(ws[1])
                m.v_proj_weight.copy_(ws[2])
            m.out_proj.weight.copy_(self.out_proj.weight)
            if self.bias:
                bs = [p.bias for p in (self.q_proj, self.k_proj, self.v_proj)]
                m.in_proj_bias.copy_(torch.cat(bs, dim=0))
                m.out_proj.bias.copy_(self.out_proj.bias)
        m.train(self.training)
        return m

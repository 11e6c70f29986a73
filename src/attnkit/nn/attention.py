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

The module receives its attention function (``attention_fn``, :mod:`attnkit.nn.attention_fn`); the
head plumbing is :mod:`attnkit.heads`'s, the cache rules :class:`~attnkit.nn.cache.KVCache`'s, the
in-projection :mod:`attnkit.nn.projection`'s, the checks :mod:`attnkit.nn.attention_checks`'.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit import checks, functional, tensor_checks
from attnkit.masks import Mask
from attnkit.nn.attention_checks import (
    check_input,
    check_mask_dims,
    check_mask_sizes,
    check_result,
)
from attnkit.nn.attention_fn import AttentionFn, default_attention
from attnkit.nn.cache import KVCache
from attnkit.nn.projection import InProjection, pack_legacy

__all__ = ["AttentionFn", "MultiHeadAttention", "default_attention"]


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
        attention_fn: the attention of the split heads, ``attention_fn(q, k, v, mask, *,
            dropout_p, return_weights) -> (out, weights | None)`` (shapes in
            :data:`AttentionFn`); default :func:`default_attention`.
        softcap: c > 0 caps the scaled scores to c * tanh(s / c) before the mask (Gemma 2's
            attention-logit softcapping); None (default): no cap. Passed to ``attention_fn`` as
            ``softcap=`` when set.
        sinks: True adds a learned attention sink per query head, the parameter ``sinks`` (H,)
            (initialised to 0): a logit that joins every row's softmax denominator and is then
            dropped (gpt-oss). Passed to ``attention_fn`` as ``sinks=`` when set.

    Parameters: ``in_proj``, the q/k/v projections (:class:`~attnkit.nn.projection.InProjection`:
    one packed weight (E + 2 G d, E) when E_k = E_v = E, as torch's ``in_proj_weight``; separate
    weights otherwise; one packed bias), ``out_proj`` (``nn.Linear``, H d -> E), and ``sinks``
    (H,) (None without sinks). ``load_state_dict`` also accepts the names of checkpoints written
    before the packed layout (``q_proj``, ``k_proj``, ``v_proj``: :func:`~attnkit.nn.projection.
    pack_legacy`).
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
        attention_fn: AttentionFn | None = None,
        softcap: float | None = None,
        sinks: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        embed_dim = checks.positive_int("embed_dim", embed_dim)
        num_heads = checks.positive_int("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim: expected a multiple of num_heads={num_heads}, got {embed_dim}"
            )
        kdim = embed_dim if kdim is None else checks.positive_int("kdim", kdim)
        vdim = embed_dim if vdim is None else checks.positive_int("vdim", vdim)
        g = num_heads if num_kv_heads is None else checks.positive_int("num_kv_heads", num_kv_heads)
        if num_heads % g:
            raise ValueError(
                f"num_kv_heads: expected a divisor of num_heads={num_heads}, got {num_kv_heads}"
            )
        bias = checks.flag("bias", bias)
        dropout = checks.probability("dropout", dropout)
        batch_first = checks.flag("batch_first", batch_first)
        softcap = None if softcap is None else checks.positive_float("softcap", softcap)
        sinks = checks.flag("sinks", sinks)
        if rotary is not None and not callable(rotary):
            raise TypeError(f"rotary: expected a callable module or None, got {type(rotary)}")
        if attention_fn is not None and not callable(attention_fn):
            raise TypeError(
                f"attention_fn: expected a callable or None, got {type(attention_fn).__name__}"
            )
        device = tensor_checks.device("device", device)
        dtype = tensor_checks.float_dtype("dtype", dtype)
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, g
        self.kdim, self.vdim = kdim, vdim
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.rotary = rotary
        self.attention_fn = default_attention if attention_fn is None else attention_fn
        kw = {"device": device, "dtype": dtype}
        self.in_proj = InProjection(embed_dim, kdim, vdim, g * self.head_dim, bias, **kw)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.softcap = softcap
        self.sinks = nn.Parameter(torch.zeros(num_heads, **kw)) if sinks else None
        self.register_load_state_dict_pre_hook(_legacy_names)

    @property
    def bias(self) -> bool:
        return self.in_proj.bias is not None

    def extra_repr(self) -> str:
        s = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
        if self.num_kv_heads != self.num_heads:
            s += f", num_kv_heads={self.num_kv_heads}"
        if (self.kdim, self.vdim) != (self.embed_dim, self.embed_dim):
            s += f", kdim={self.kdim}, vdim={self.vdim}"
        if self.softcap is not None:
            s += f", softcap={self.softcap:g}"
        if self.sinks is not None:
            s += ", sinks=True"
        if self.attention_fn is not default_attention:
            s += f", attention_fn={getattr(self.attention_fn, '__name__', self.attention_fn)}"
        return s + f", dropout={self.dropout}, batch_first={self.batch_first}"

    def new_cache(self, static: bool = False) -> KVCache:
        """An empty cache owned by this module: ``static=False`` for self-attention (grows each
        call), ``static=True`` for cross-attention (filled from the memory once)."""
        c = KVCache(static=static)
        c.claim(self)
        return c

    # -----------------------------------------------------------------------------------------
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
            key: (B, Lk, E_k); defaults to ``query`` (self-attention). A ``value`` without
                ``key`` is refused (ValueError), as in Flax: the query is not a key by default.
            value: (B, Lk, E_v); defaults to ``key``.
            mask: True = may attend; mask object or tensor broadcastable to (B, H, Lq, Lk),
                where Lk counts the cached keys too. With cached keys, every part of the mask
                that compares positions must be bottom-right aligned (the new queries follow
                the cached keys): ``causal("bottom_right")``,
                ``sliding_window(w, 0, alignment="bottom_right")``,
                ``prefix_lm(n, alignment="bottom_right")``; top-left parts are refused
                (ValueError) once the cache holds keys. Key padding and ALiBi need no option.
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
        return_weights = checks.flag("return_weights", return_weights)
        average_weights = checks.flag("average_weights", average_weights)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache: expected a KVCache or None, got {type(cache).__name__}")
        if key is None and value is not None:
            raise ValueError(
                "key: value was given without key; pass key as well (the query is the key only "
                "in self-attention, called with the query alone)"
            )
        # a filled static cache needs no key/value: they were projected at the first call
        reuse = cache is not None and cache.static and cache.k is not None
        skip_kv = reuse and key is None
        key = query if key is None else key
        value = key if value is None else value
        # which inputs are one tensor: one packed product for all three, or for k and v
        same = (key is query and value is query, value is key)
        w, bf = self.out_proj.weight, self.batch_first
        query = check_input("query", query, self.embed_dim, "embed_dim", w, bf)
        b, lq, _ = query.shape
        lk = 0
        if not skip_kv:
            key = check_input("key", key, self.kdim, "kdim", w, bf)
            value = check_input("value", value, self.vdim, "vdim", w, bf)
            if key.shape[0] != b or value.shape[:2] != key.shape[:2]:
                raise ValueError(
                    f"key/value: expected (B, Lk, .) with B = {b} like query and the same Lk, "
                    f"got key {tuple(key.shape)}, value {tuple(value.shape)} (batch first)"
                )
            lk = key.shape[1]
        check_mask_dims(mask)
        if cache is not None:
            kv_len = None if skip_kv else lk
            cache.check(self, b, mask, kv_len=kv_len, rotary=self.rotary is not None)
            lk = cache.size if reuse else lk + (0 if cache.static else cache.size)
        # the whole mask is checked against (B, H, Lq, Lk) before any work (and before the
        # cache changes); attention_fn receives it as the caller gave it
        check_mask_sizes(self, mask, (b, self.num_heads), lq, lk, query.device)

        q, k, v = self._project(query, key, value, reuse, same)
        q = functional.split_heads(q, self.num_heads)  # (B, H, Lq, d)
        if not reuse:
            k = functional.split_heads(k, self.num_kv_heads)  # (B, G, Lk_new, d)
            v = functional.split_heads(v, self.num_kv_heads)  # (B, G, Lk_new, d)
            if self.rotary is not None:
                q_off, k_off = (0, 0) if cache is None else cache.positions()
                q, k = self.rotary(q, k, q_off, k_off)
        if cache is not None:
            k, v = cache.update(k, v, lq)  # (B, G, Lk, d): everything cached
        dropout_p = self.dropout if self.training else 0.0
        extra = {} if self.softcap is None else {"softcap": self.softcap}
        if self.sinks is not None:
            extra["sinks"] = self.sinks
        res = self.attention_fn(
            q, k, v, mask, dropout_p=dropout_p, return_weights=return_weights, **extra
        )
        shape = (b, self.num_heads, lq, self.head_dim)
        out, weights = check_result(res, shape, lk, return_weights)
        out = self.out_proj(functional.merge_heads(out))  # (B, Lq, E)
        if weights is not None and average_weights:
            weights = weights.mean(dim=1)
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, reuse: bool, same: tuple[bool, bool]
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(q (B, Lq, E), k (B, Lk, G d), v) with as few products as the inputs allow: one for
        self-attention, two when key is value (cross-attention), three otherwise; k and v None
        when a filled static cache holds them."""
        p = self.in_proj
        if reuse:
            return p.q(query), None, None
        if same[0]:
            return p.qkv(query)
        if same[1]:
            return (p.q(query), *p.kv(key))
        return p.q(query), p.k(key), p.v(value)

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
        with torch.no_grad():
            for ours, theirs in new.torch_pairs(m):
                ours.copy_(theirs)
        new.train(m.training)
        return new

    def torch_pairs(self, m: nn.MultiheadAttention) -> list[tuple[Tensor, Tensor]]:
        """(our parameter, ``m``'s) for every parameter of a ``torch.nn.MultiheadAttention``
        of the same sizes and biases: the layouts agree (packed ``in_proj_weight`` when
        kdim == vdim == embed_dim, else ``q/k/v_proj_weight``; one packed bias)."""
        p = self.in_proj
        if p.packed:
            pairs = [(p.weight, m.in_proj_weight)]
        else:
            pairs = [(p.q_weight, m.q_proj_weight), (p.k_weight, m.k_proj_weight)]
            pairs.append((p.v_weight, m.v_proj_weight))
        pairs.append((self.out_proj.weight, m.out_proj.weight))
        if self.bias:
            pairs += [(p.bias, m.in_proj_bias), (self.out_proj.bias, m.out_proj.bias)]
        return pairs

    def to_torch(self) -> nn.MultiheadAttention:
        """The equivalent ``torch.nn.MultiheadAttention`` (same weights). Only for
        ``num_kv_heads == num_heads``, no rotary embedding and the default ``attention_fn``
        (torch has none of them), without softcap or sinks."""
        if self.num_kv_heads != self.num_heads:
            raise ValueError(
                f"num_kv_heads: torch.nn.MultiheadAttention has no grouped-query heads "
                f"(num_kv_heads={self.num_kv_heads} != num_heads={self.num_heads})"
            )
        if self.rotary is not None:
            raise ValueError("rotary: torch.nn.MultiheadAttention has no rotary embedding")
        if self.softcap is not None or self.sinks is not None:
            what = "softcap" if self.softcap is not None else "sinks"
            raise ValueError(f"{what}: torch.nn.MultiheadAttention has no {what}")
        if self.attention_fn is not default_attention:
            raise ValueError(
                "attention_fn: torch.nn.MultiheadAttention has no custom attention function"
            )
        w0 = self.out_proj.weight
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
            for ours, theirs in self.torch_pairs(m):
                theirs.copy_(ours)
        m.train(self.training)
        return m


def _legacy_names(module: nn.Module, state: dict, prefix: str, *_args: object) -> None:
    """load_state_dict pre-hook: the separate q/k/v names of older checkpoints packed
    (:func:`~attnkit.nn.projection.pack_legacy`)."""
    pack_legacy(state, prefix)

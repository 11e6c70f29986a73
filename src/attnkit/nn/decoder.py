"""The Transformer decoder: :class:`TransformerDecoderLayer` (masked self-attention,
cross-attention to the encoder memory, a feed-forward block) and :class:`TransformerDecoder` (a
stack of them with an optional KV cache, then an optional norm). Shapes and mask conventions as
in :mod:`attnkit.nn.transformer`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnkit.masks import Mask
from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.cache import DecoderCache, DecoderLayerCache
from attnkit.nn.dropout import Dropout
from attnkit.nn.transformer_parts import (
    FeedForward,
    batch_len,
    check_attn_mask,
    check_norm,
    check_same_batch,
    clones,
    copy_final_norm,
    copy_linear,
    copy_norm,
    layer_args,
    layer_kwargs,
    renamed,
)

MaskLike = Mask | Tensor | None

__all__ = ["TransformerDecoder", "TransformerDecoderLayer"]


class TransformerDecoderLayer(FeedForward):
    """Masked self-attention, cross-attention to the encoder memory, then a feed-forward
    block; each with a residual and a LayerNorm.

    Args: as ``torch.nn.TransformerDecoderLayer`` (``activation`` "relu" or "gelu"), but
    ``batch_first`` defaults to True.
    Submodules (torch names): ``self_attn``, ``multihead_attn``, ``linear1``, ``dropout``,
    ``linear2``, ``norm1``, ``norm2``, ``norm3``, ``dropout1``, ``dropout2``, ``dropout3``.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = True,
        norm_first: bool = False,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        a = layer_args(
            d_model,
            nhead,
            dim_feedforward,
            dropout,
            activation,
            layer_norm_eps,
            dict(batch_first=batch_first, norm_first=norm_first, bias=bias),
            device,
            dtype,
        )
        d_model, dropout, bias, eps = a["d_model"], a["dropout"], a["bias"], a["layer_norm_eps"]
        kw = {"device": a["device"], "dtype": a["dtype"]}
        mha = dict(bias=bias, dropout=dropout, batch_first=a["batch_first"], **kw)
        self.self_attn = MultiHeadAttention(d_model, a["nhead"], **mha)
        self.multihead_attn = MultiHeadAttention(d_model, a["nhead"], **mha)
        self._init_ff(d_model, a["dim_feedforward"], dropout, a["activation"], bias, kw)
        self.norm_first = a["norm_first"]
        self.norm1 = nn.LayerNorm(d_model, eps=eps, bias=bias, **kw)
        self.norm2 = nn.LayerNorm(d_model, eps=eps, bias=bias, **kw)
        self.norm3 = nn.LayerNorm(d_model, eps=eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)

    @property
    def batch_first(self) -> bool:
        return self.self_attn.batch_first

    def new_cache(self) -> DecoderLayerCache:
        """Empty caches owned by this layer's self- and cross-attention."""
        return DecoderLayerCache(self.self_attn.new_cache(), self.multihead_attn.new_cache(True))

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: MaskLike = None,
        memory_mask: MaskLike = None,
        cache: DecoderLayerCache | None = None,
    ) -> Tensor:
        """tgt: (B, T, E), memory: (B, S, E) -> (B, T, E).

        ``tgt_mask`` covers (T, T_all) self-attention, ``memory_mask`` (T, S) cross-attention;
        True = may attend. With ``cache`` (a :class:`DecoderLayerCache`), ``tgt`` holds only
        the new target tokens: their keys/values are appended to the self-attention cache and
        the memory's keys/values are computed once. Use ``tgt_mask=causal("bottom_right")``
        in both modes (it equals ``causal()`` when T = T_all); for a single new token the
        mask may be None.
        """
        if cache is not None and not isinstance(cache, DecoderLayerCache):
            raise TypeError(
                f"cache: expected a DecoderLayerCache or None, got {type(cache).__name__}"
            )
        x, memory = self.check_inputs(tgt, memory, tgt_mask, memory_mask, cache)
        sc = None if cache is None else cache.self_attn
        cc = None if cache is None else cache.cross_attn
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, sc)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, cc)
            x = x + self.dropout3(self._ff_block(self.norm3(x)))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, sc))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, cc))
            x = self.norm3(x + self.dropout3(self._ff_block(x)))
        return x

    def check_inputs(
        self, tgt, memory, tgt_mask, memory_mask, cache: DecoderLayerCache | None
    ) -> tuple[Tensor, Tensor]:
        """Check every input of one decoder layer call (and the cache rules) before any work;
        errors name ``tgt``, ``memory``, ``tgt_mask``, ``memory_mask`` or ``cache``."""
        x = self.check_src("tgt", tgt)
        memory = self.check_src("memory", memory)
        check_same_batch("memory", memory, "tgt", x, self.batch_first)
        (b, t), s = batch_len(x, self.batch_first), batch_len(memory, self.batch_first)[1]
        h, cached = self.self_attn.num_heads, 0
        if cache is not None:
            cached = cache.self_attn.size
            with renamed(mask="tgt_mask"):
                cache.self_attn.check(self.self_attn, b, tgt_mask)
            with renamed(mask="memory_mask", key="memory"):
                cache.cross_attn.check(self.multihead_attn, b, memory_mask, kv_len=s)
        check_attn_mask("tgt_mask", tgt_mask, b, h, t, cached + t, x)
        check_attn_mask("memory_mask", memory_mask, b, h, t, s, x)
        return x, memory

    def _sa_block(self, x, mask, cache) -> Tensor:
        return self.dropout1(self.self_attn(x, mask=mask, cache=cache)[0])

    def _mha_block(self, x, memory, mask, cache) -> Tensor:
        return self.dropout2(self.multihead_attn(x, memory, memory, mask, cache=cache)[0])

    @classmethod
    def from_torch(cls, m: nn.TransformerDecoderLayer) -> TransformerDecoderLayer:
        """Copy a ``torch.nn.TransformerDecoderLayer`` (weights, sizes, options, train/eval)."""
        if not isinstance(m, nn.TransformerDecoderLayer):
            raise TypeError(f"m: expected a torch.nn.TransformerDecoderLayer, got {type(m)}")
        if not m.norm1.eps == m.norm2.eps == m.norm3.eps:
            raise ValueError("m: norm1/norm2/norm3 have different eps")
        new = cls(**layer_kwargs(m))
        with torch.no_grad():
            new.self_attn = MultiHeadAttention.from_torch(m.self_attn)
            new.multihead_attn = MultiHeadAttention.from_torch(m.multihead_attn)
            for name in ("linear1", "linear2"):
                copy_linear(getattr(new, name), getattr(m, name))
            for name in ("norm1", "norm2", "norm3"):
                copy_norm(getattr(new, name), getattr(m, name))
        new.train(m.training)
        return new


class TransformerDecoder(nn.Module):
    """A stack of decoder layers, then an optional final norm; supports a
    :class:`~attnkit.nn.cache.DecoderCache` for incremental decoding.

    Args: as :class:`TransformerEncoder`, with :class:`TransformerDecoderLayer`.
    """

    def __init__(
        self,
        decoder_layer: TransformerDecoderLayer | Sequence[TransformerDecoderLayer],
        num_layers: int | None = None,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(clones(decoder_layer, num_layers, TransformerDecoderLayer))
        self.num_layers = len(self.layers)
        self.norm = check_norm(norm)

    def new_cache(self) -> DecoderCache:
        """Empty caches, one per layer, owned by the layers' attention modules."""
        return DecoderCache([layer.new_cache() for layer in self.layers])

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: MaskLike = None,
        memory_mask: MaskLike = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """tgt: (B, T, E), memory: (B, S, E) -> (B, T, E); masks and ``cache`` as in
        :meth:`TransformerDecoderLayer.forward` (``cache`` from :meth:`new_cache`).

        Incremental decoding::

            cache = decoder.new_cache()
            for t in range(T):
                y_t = decoder(tgt[:, t : t + 1], memory, causal("bottom_right"), mem_mask,
                              cache=cache)        # (B, 1, E), equal to the full causal forward
        """
        if cache is not None:
            if not isinstance(cache, DecoderCache):
                raise TypeError(f"cache: expected a DecoderCache or None, got {type(cache)}")
            if len(cache.layers) != self.num_layers:
                raise ValueError(
                    f"cache: holds {len(cache.layers)} layer caches, the decoder has "
                    f"{self.num_layers} layers"
                )
        for i, layer in enumerate(self.layers):  # every layer's cache rules, before any work
            c = None if cache is None else cache.layers[i]
            if c is not None and not isinstance(c, DecoderLayerCache):
                raise TypeError(
                    f"cache: layer {i} holds {type(c).__name__}, not a DecoderLayerCache"
                )
            x, memory = layer.check_inputs(tgt, memory, tgt_mask, memory_mask, c)
        return self._run(x, memory, tgt_mask, memory_mask, cache)

    def _run(self, x, memory, tgt_mask, memory_mask, cache) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, tgt_mask, memory_mask, None if cache is None else cache.layers[i])
        return x if self.norm is None else self.norm(x)

    @classmethod
    def from_torch(cls, m: nn.TransformerDecoder) -> TransformerDecoder:
        """Copy a ``torch.nn.TransformerDecoder`` (every layer and the final norm)."""
        if not isinstance(m, nn.TransformerDecoder):
            raise TypeError(f"m: expected a torch.nn.TransformerDecoder, got {type(m)}")
        layers = [TransformerDecoderLayer.from_torch(x) for x in m.layers]
        new = cls(layers, norm=copy_final_norm(m.norm))
        new.train(m.training)
        return new

"""The encoder–decoder Transformer (Vaswani et al.), layer by layer, interchangeable with
``torch.nn.Transformer*`` through ``from_torch``.

Shape legend
------------
``B``  batch        ``S``  source length        ``T``  target length (new target tokens when a
                                                 cache is used; ``T_all`` counts cached ones too)
``E``  d_model      ``F``  dim_feedforward

Tensors are (B, L, E) with ``batch_first=True`` (the default) and (L, B, E) otherwise.

Masks: **True = may attend** (see :mod:`attnkit.masks`), never torch's True = ignore. Combine
them with ``&``: ``causal() & key_padding(lengths)``; torch-style padding masks convert with
``masks.from_key_padding_mask(pad)``. ``mask`` / ``tgt_mask`` apply to self-attention
((S, S) / (T, T_all)), ``memory_mask`` to the decoder's cross-attention ((T, S)).

Each layer is post-norm (``x = norm(x + sublayer(x))``, the paper's form) by default and
pre-norm (``x = x + sublayer(norm(x))``) with ``norm_first=True``, as in torch.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.masks import Mask
from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.cache import DecoderCache, DecoderLayerCache

__all__ = [
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}

MaskLike = Mask | Tensor | None


def _check_activation(activation: object) -> str:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation: expected 'relu' or 'gelu', got {activation!r}")
    return activation  # type: ignore[return-value]


def _torch_activation(act: object) -> str:
    """The name of a torch layer's activation (a function, module or legacy string)."""
    if act is F.relu or isinstance(act, nn.ReLU) or act == "relu":
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none") or act == "gelu":
        return "gelu"
    raise ValueError(f"m: activation {act!r} is not supported (expected relu or gelu)")


def _copy_linear(dst: nn.Linear, src: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    if src.bias is not None:
        dst.bias.copy_(src.bias)


def _copy_norm(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
    if src.weight is not None:
        dst.weight.copy_(src.weight)
    if src.bias is not None:
        dst.bias.copy_(src.bias)


def _layer_kwargs(m: nn.Module) -> dict:
    """Constructor arguments of an attnkit layer mirroring torch layer ``m``."""
    w = m.linear1.weight
    return dict(
        d_model=m.self_attn.embed_dim,
        nhead=m.self_attn.num_heads,
        dim_feedforward=m.linear1.out_features,
        dropout=m.dropout.p,
        activation=_torch_activation(m.activation),
        layer_norm_eps=m.norm1.eps,
        batch_first=m.self_attn.batch_first,
        norm_first=m.norm_first,
        bias=m.linear1.bias is not None,
        device=w.device,
        dtype=w.dtype,
    )


def _check_heads(d_model: object, nhead: object) -> None:
    for name, x in (("d_model", d_model), ("nhead", nhead)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name}: expected a positive int, got {x!r}")
    if d_model % nhead:
        raise ValueError(f"d_model: expected a multiple of nhead={nhead}, got {d_model}")


def _check_seq(name: str, x: object, d_model: int, batch_first: bool) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != d_model:
        layout = "(B, L, d_model)" if batch_first else "(L, B, d_model)"
        raise ValueError(
            f"{name}: expected shape {layout} with d_model={d_model}, got {tuple(x.shape)}"
        )
    return x


def _clones(layer: nn.Module | Sequence[nn.Module], num_layers: int | None, kind: type) -> list:
    if isinstance(layer, kind):
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers: expected a positive int, got {num_layers!r}")
        return [copy.deepcopy(layer) for _ in range(num_layers)]
    if isinstance(layer, Sequence) and layer and all(isinstance(x, kind) for x in layer):
        if num_layers is not None and num_layers != len(layer):
            raise ValueError(f"num_layers: got {num_layers} for a list of {len(layer)} layers")
        return list(layer)
    raise TypeError(
        f"layers: expected a {kind.__name__} or a non-empty list of them, got {layer!r}"
    )


class _FeedForward(nn.Module):
    """Shared parts of both layer kinds: the position-wise feed-forward block."""

    def _init_ff(self, d_model, dim_feedforward, dropout, activation, bias, kw) -> None:
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.activation = _check_activation(activation)

    def _ff_block(self, x: Tensor) -> Tensor:
        """(B, L, E) -> (B, L, E): linear2(dropout(act(linear1(x))))."""
        return self.linear2(self.dropout(_ACTIVATIONS[self.activation](self.linear1(x))))


class TransformerEncoderLayer(_FeedForward):
    """Self-attention then a feed-forward block, each with a residual and a LayerNorm.

    Args: as ``torch.nn.TransformerEncoderLayer`` (``activation`` "relu" or "gelu"), but
    ``batch_first`` defaults to True.
    Submodules (torch names): ``self_attn``, ``linear1``, ``dropout``, ``linear2``, ``norm1``,
    ``norm2``, ``dropout1``, ``dropout2``.
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
        _check_heads(d_model, nhead)
        kw = {"device": device, "dtype": dtype}
        self.self_attn = MultiHeadAttention(
            d_model, nhead, bias=bias, dropout=dropout, batch_first=batch_first, **kw
        )
        self._init_ff(d_model, dim_feedforward, dropout, activation, bias, kw)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    @property
    def batch_first(self) -> bool:
        return self.self_attn.batch_first

    def forward(self, src: Tensor, mask: MaskLike = None) -> Tensor:
        """src: (B, S, E) -> (B, S, E). ``mask``: True = may attend, over (S, S) per batch
        element (e.g. ``key_padding(lengths)``, ``causal() & from_key_padding_mask(pad)``)."""
        x = _check_seq("src", src, self.self_attn.embed_dim, self.batch_first)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), mask)
            x = x + self.dropout2(self._ff_block(self.norm2(x)))
        else:
            x = self.norm1(x + self._sa_block(x, mask))
            x = self.norm2(x + self.dropout2(self._ff_block(x)))
        return x

    def _sa_block(self, x: Tensor, mask: MaskLike) -> Tensor:
        return self.dropout1(self.self_attn(x, mask=mask)[0])

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoderLayer) -> TransformerEncoderLayer:
        """Copy a ``torch.nn.TransformerEncoderLayer`` (weights, sizes, options, train/eval)."""
        if not isinstance(m, nn.TransformerEncoderLayer):
            raise TypeError(f"m: expected a torch.nn.TransformerEncoderLayer, got {type(m)}")
        if m.norm1.eps != m.norm2.eps:
            raise ValueError(f"m: norm1.eps {m.norm1.eps} != norm2.eps {m.norm2.eps}")
        new = cls(**_layer_kwargs(m))
        with torch.no_grad():
            new.self_attn = MultiHeadAttention.from_torch(m.self_attn)
            for name in ("linear1", "linear2"):
                _copy_linear(getattr(new, name), getattr(m, name))
            for name in ("norm1", "norm2"):
                _copy_norm(getattr(new, name), getattr(m, name))
        new.train(m.training)
        return new


class TransformerDecoderLayer(_FeedForward):
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
        _check_heads(d_model, nhead)
        kw = {"device": device, "dtype": dtype}
        mha = dict(bias=bias, dropout=dropout, batch_first=batch_first, **kw)
        self.self_attn = MultiHeadAttention(d_model, nhead, **mha)
        self.multihead_attn = MultiHeadAttention(d_model, nhead, **mha)
        self._init_ff(d_model, dim_feedforward, dropout, activation, bias, kw)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

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
        e = self.self_attn.embed_dim
        x = _check_seq("tgt", tgt, e, self.batch_first)
        memory = _check_seq("memory", memory, e, self.batch_first)
        if cache is not None and not isinstance(cache, DecoderLayerCache):
            raise TypeError(
                f"cache: expected a DecoderLayerCache or None, got {type(cache).__name__}"
            )
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
        new = cls(**_layer_kwargs(m))
        with torch.no_grad():
            new.self_attn = MultiHeadAttention.from_torch(m.self_attn)
            new.multihead_attn = MultiHeadAttention.from_torch(m.multihead_attn)
            for name in ("linear1", "linear2"):
                _copy_linear(getattr(new, name), getattr(m, name))
            for name in ("norm1", "norm2", "norm3"):
                _copy_norm(getattr(new, name), getattr(m, name))
        new.train(m.training)
        return new


def _copy_final_norm(norm: nn.Module | None) -> nn.LayerNorm | None:
    if norm is None:
        return None
    if not isinstance(norm, nn.LayerNorm):
        raise ValueError(f"m: norm must be a LayerNorm or None, got {type(norm).__name__}")
    return copy.deepcopy(norm)


class TransformerEncoder(nn.Module):
    """A stack of encoder layers, then an optional final norm.

    Args:
        encoder_layer: a :class:`TransformerEncoderLayer`, deep-copied ``num_layers`` times
            (as torch does), or a list of layers (then ``num_layers`` may be omitted).
        num_layers: number of copies.
        norm: final module applied to the output (torch.nn.Transformer uses a LayerNorm).
    """

    def __init__(
        self,
        encoder_layer: TransformerEncoderLayer | Sequence[TransformerEncoderLayer],
        num_layers: int | None = None,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_clones(encoder_layer, num_layers, TransformerEncoderLayer))
        self.num_layers = len(self.layers)
        self.norm = norm

    def forward(self, src: Tensor, mask: MaskLike = None) -> Tensor:
        """src: (B, S, E) -> (B, S, E); ``mask`` as in :meth:`TransformerEncoderLayer.forward`."""
        x = src
        for layer in self.layers:
            x = layer(x, mask)
        return x if self.norm is None else self.norm(x)

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoder) -> TransformerEncoder:
        """Copy a ``torch.nn.TransformerEncoder`` (every layer and the final norm)."""
        if not isinstance(m, nn.TransformerEncoder):
            raise TypeError(f"m: expected a torch.nn.TransformerEncoder, got {type(m)}")
        layers = [TransformerEncoderLayer.from_torch(x) for x in m.layers]
        new = cls(layers, norm=_copy_final_norm(m.norm))
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
        self.layers = nn.ModuleList(_clones(decoder_layer, num_layers, TransformerDecoderLayer))
        self.num_layers = len(self.layers)
        self.norm = norm

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
        x = tgt
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, tgt_mask, memory_mask, None if cache is None else cache.layers[i])
        return x if self.norm is None else self.norm(x)

    @classmethod
    def from_torch(cls, m: nn.TransformerDecoder) -> TransformerDecoder:
        """Copy a ``torch.nn.TransformerDecoder`` (every layer and the final norm)."""
        if not isinstance(m, nn.TransformerDecoder):
            raise TypeError(f"m: expected a torch.nn.TransformerDecoder, got {type(m)}")
        layers = [TransformerDecoderLayer.from_torch(x) for x in m.layers]
        new = cls(layers, norm=_copy_final_norm(m.norm))
        new.train(m.training)
        return new


class Transformer(nn.Module):
    """Encoder–decoder Transformer: ``decoder(tgt, encoder(src))``, each stack ending in a
    LayerNorm, as ``torch.nn.Transformer`` (same arguments; ``batch_first`` defaults to True).

    Submodules: ``encoder`` (:class:`TransformerEncoder`), ``decoder``
    (:class:`TransformerDecoder`). Parameters are initialised as torch does (Xavier uniform on
    every matrix).
    """

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
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
        kw = {"device": device, "dtype": dtype}
        args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps)
        opts = dict(batch_first=batch_first, norm_first=norm_first, bias=bias, **kw)
        self.encoder = TransformerEncoder(
            TransformerEncoderLayer(*args, **opts),
            num_encoder_layers,
            nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw),
        )
        self.decoder = TransformerDecoder(
            TransformerDecoderLayer(*args, **opts),
            num_decoder_layers,
            nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw),
        )
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src: Tensor, src_mask: MaskLike = None) -> Tensor:
        """memory = encoder(src): (B, S, E) -> (B, S, E)."""
        return self.encoder(src, src_mask)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: MaskLike = None,
        memory_mask: MaskLike = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """decoder(tgt, memory): (B, T, E) -> (B, T, E); see :meth:`TransformerDecoder.forward`."""
        return self.decoder(tgt, memory, tgt_mask, memory_mask, cache)

    def new_cache(self) -> DecoderCache:
        """An empty decoder cache for incremental decoding with :meth:`decode`."""
        return self.decoder.new_cache()

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: MaskLike = None,
        tgt_mask: MaskLike = None,
        memory_mask: MaskLike = None,
    ) -> Tensor:
        """src: (B, S, E), tgt: (B, T, E) -> (B, T, E).

        ``src_mask`` (S, S) for the encoder, ``tgt_mask`` (T, T) for the decoder's
        self-attention (usually ``causal()``, combined with target padding), ``memory_mask``
        (T, S) for cross-attention (usually the source padding); True = may attend.
        """
        e = self.d_model
        src = _check_seq("src", src, e, self.batch_first)
        tgt = _check_seq("tgt", tgt, e, self.batch_first)
        bdim = 0 if self.batch_first else 1
        if src.shape[bdim] != tgt.shape[bdim]:
            raise ValueError(
                f"tgt: batch size {tgt.shape[bdim]} differs from src's {src.shape[bdim]}"
            )
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask, memory_mask)

    @classmethod
    def from_torch(cls, m: nn.Transformer) -> Transformer:
        """Copy a ``torch.nn.Transformer`` (both stacks, their final norms, batch_first)."""
        if not isinstance(m, nn.Transformer):
            raise TypeError(f"m: expected a torch.nn.Transformer, got {type(m)}")
        if not isinstance(m.encoder, nn.TransformerEncoder) or not isinstance(
            m.decoder, nn.TransformerDecoder
        ):
            raise ValueError("m: custom_encoder / custom_decoder are not supported")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.encoder = TransformerEncoder.from_torch(m.encoder)
        new.decoder = TransformerDecoder.from_torch(m.decoder)
        new.d_model, new.nhead = m.d_model, m.nhead
        new.batch_first = new.encoder.layers[0].batch_first
        new.train(m.training)
        return new

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

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit.masks import Mask
from attnkit.nn.cache import DecoderCache
from attnkit.nn.decoder import TransformerDecoder, TransformerDecoderLayer
from attnkit.nn.encoder import TransformerEncoder, TransformerEncoderLayer
from attnkit.nn.projection import InProjection
from attnkit.nn.transformer_parts import batch_len, check_attn_mask, check_same_batch, layer_args

__all__ = [
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]

MaskLike = Mask | Tensor | None


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
        n_enc = checks.positive_int("num_encoder_layers", num_encoder_layers)
        n_dec = checks.positive_int("num_decoder_layers", num_decoder_layers)
        d_model, bias, eps = a["d_model"], a["bias"], a["layer_norm_eps"]
        kw = {"device": a["device"], "dtype": a["dtype"]}
        args = (d_model, a["nhead"], a["dim_feedforward"], a["dropout"], a["activation"], eps)
        opts = dict(batch_first=a["batch_first"], norm_first=a["norm_first"], bias=bias, **kw)
        self.encoder = TransformerEncoder(
            TransformerEncoderLayer(*args, **opts),
            n_enc,
            nn.LayerNorm(d_model, eps=eps, bias=bias, **kw),
        )
        self.decoder = TransformerDecoder(
            TransformerDecoderLayer(*args, **opts),
            n_dec,
            nn.LayerNorm(d_model, eps=eps, bias=bias, **kw),
        )
        self.d_model, self.nhead, self.batch_first = d_model, a["nhead"], a["batch_first"]
        packed = {
            id(m.weight): m for m in self.modules() if isinstance(m, InProjection) and m.packed
        }
        for p in self.parameters():
            if id(p) in packed:  # q, k, v blocks each as its own matrix
                packed[id(p)].xavier_()
            elif p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src: Tensor, src_mask: MaskLike = None) -> Tensor:
        """memory = encoder(src): (B, S, E) -> (B, S, E)."""
        src = self.encoder.layers[0].check_inputs(src, src_mask, "src_mask")
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
        enc, dec = self.encoder.layers[0], self.decoder.layers[0]
        src = enc.check_inputs(src, src_mask, "src_mask")
        tgt = dec.check_src("tgt", tgt)
        check_same_batch("tgt", tgt, "src", src, self.batch_first)
        (b, t), s = batch_len(tgt, self.batch_first), batch_len(src, self.batch_first)[1]
        h = dec.self_attn.num_heads
        check_attn_mask("tgt_mask", tgt_mask, b, h, t, t, tgt)
        check_attn_mask("memory_mask", memory_mask, b, h, t, s, tgt)
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

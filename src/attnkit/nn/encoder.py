"""The Transformer encoder: :class:`TransformerEncoderLayer` (self-attention, then a
feed-forward block) and :class:`TransformerEncoder` (a stack of them, then an optional norm).
Shapes and mask conventions as in :mod:`attnkit.nn.transformer`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit.masks import Mask
from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.dropout import Dropout
from attnkit.nn.transformer_parts import (
    FeedForward,
    batch_len,
    check_attn_mask,
    check_norm,
    clones,
    copy_final_norm,
    copy_linear,
    copy_norm,
    layer_args,
    layer_kwargs,
)

MaskLike = Mask | Tensor | None

__all__ = ["TransformerEncoder", "TransformerEncoderLayer"]


class TransformerEncoderLayer(FeedForward):
    """Self-attention then a feed-forward block, each with a residual and a LayerNorm.

    Post-norm (``norm_first=False``, the default, as BERT)::

        x = norm1(x + dropout1(self_attn(x)))
        x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))

    pre-norm (``norm_first=True``): ``x = x + dropout1(self_attn(norm1(x)))``, then
    ``x = x + dropout2(ff(norm2(x)))``.

    Args: as ``torch.nn.TransformerEncoderLayer`` (``activation`` "relu" or "gelu", the exact
    erf GELU), but ``batch_first`` defaults to True; and, keyword-only:
        attention_dropout: dropout on the attention weights (default ``dropout``; BERT's
            ``attention_probs_dropout_prob``).
        activation_dropout: dropout between the activation and ``linear2`` (default
            ``dropout`` as torch; BERT has none: 0.0).
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
        *,
        attention_dropout: float | None = None,
        activation_dropout: float | None = None,
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
        p_attn, p_act = (
            dropout if p is None else checks.probability(name, p)
            for name, p in (
                ("attention_dropout", attention_dropout),
                ("activation_dropout", activation_dropout),
            )
        )
        kw = {"device": a["device"], "dtype": a["dtype"]}
        self.self_attn = MultiHeadAttention(
            d_model, a["nhead"], bias=bias, dropout=p_attn, batch_first=a["batch_first"], **kw
        )
        self._init_ff(d_model, a["dim_feedforward"], p_act, a["activation"], bias, kw)
        self.norm_first = a["norm_first"]
        self.norm1 = nn.LayerNorm(d_model, eps=eps, bias=bias, **kw)
        self.norm2 = nn.LayerNorm(d_model, eps=eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)

    @property
    def batch_first(self) -> bool:
        return self.self_attn.batch_first

    def forward(
        self, src: Tensor, mask: MaskLike = None, *, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """src: (B, S, E) -> (B, S, E). ``mask``: True = may attend, over (S, S) per batch
        element (e.g. ``key_padding(lengths)``, ``causal() & from_key_padding_mask(pad)``).
        With ``return_weights=True``: (output, the self-attention weights (B, H, S, S))."""
        return_weights = checks.flag("return_weights", return_weights)
        x = self.check_inputs(src, mask)
        if self.norm_first:
            a, w = self._sa_block(self.norm1(x), mask, return_weights)
            x = x + a
            x = x + self.dropout2(self._ff_block(self.norm2(x)))
        else:
            a, w = self._sa_block(x, mask, return_weights)
            x = self.norm1(x + a)
            x = self.norm2(x + self.dropout2(self._ff_block(x)))
        return (x, w) if return_weights else x

    def check_inputs(self, src: object, mask: object, mask_name: str = "mask") -> Tensor:
        """Check ``src`` and its self-attention mask (named as the caller passed them)."""
        x = self.check_src("src", src)
        b, s = batch_len(x, self.batch_first)
        check_attn_mask(mask_name, mask, b, self.self_attn.num_heads, s, s, x)
        return x

    def _sa_block(
        self, x: Tensor, mask: MaskLike, return_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        a, w = self.self_attn(x, mask=mask, return_weights=return_weights)
        return self.dropout1(a), w

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoderLayer) -> TransformerEncoderLayer:
        """Copy a ``torch.nn.TransformerEncoderLayer`` (weights, sizes, options, train/eval)."""
        if not isinstance(m, nn.TransformerEncoderLayer):
            raise TypeError(f"m: expected a torch.nn.TransformerEncoderLayer, got {type(m)}")
        if m.norm1.eps != m.norm2.eps:
            raise ValueError(f"m: norm1.eps {m.norm1.eps} != norm2.eps {m.norm2.eps}")
        new = cls(**layer_kwargs(m))
        with torch.no_grad():
            new.self_attn = MultiHeadAttention.from_torch(m.self_attn)
            for name in ("linear1", "linear2"):
                copy_linear(getattr(new, name), getattr(m, name))
            for name in ("norm1", "norm2"):
                copy_norm(getattr(new, name), getattr(m, name))
        new.train(m.training)
        return new


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
        self.layers = nn.ModuleList(clones(encoder_layer, num_layers, TransformerEncoderLayer))
        self.num_layers = len(self.layers)
        self.norm = check_norm(norm)

    def forward(self, src: Tensor, mask: MaskLike = None) -> Tensor:
        """src: (B, S, E) -> (B, S, E); ``mask`` as in :meth:`TransformerEncoderLayer.forward`."""
        return self._run(self.layers[0].check_inputs(src, mask), mask)

    def _run(self, x: Tensor, mask: MaskLike) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return x if self.norm is None else self.norm(x)

    @classmethod
    def from_torch(cls, m: nn.TransformerEncoder) -> TransformerEncoder:
        """Copy a ``torch.nn.TransformerEncoder`` (every layer and the final norm)."""
        if not isinstance(m, nn.TransformerEncoder):
            raise TypeError(f"m: expected a torch.nn.TransformerEncoder, got {type(m)}")
        layers = [TransformerEncoderLayer.from_torch(x) for x in m.layers]
        new = cls(layers, norm=copy_final_norm(m.norm))
        new.train(m.training)
        return new

"""The plain-PyTorch peers of the training rows (``bench_train.py``), written the way PyTorch users
write them, with attnkit's weights loaded into them so both sides compute the same function.

:class:`TutorialSeq2Seq`: the encoder–decoder of PyTorch's translation tutorial
("Language Translation with nn.Transformer and torchtext"): token embeddings × sqrt(d_model),
sinusoidal positions with dropout, ``torch.nn.Transformer``, a linear generator; padded batches
with key-padding masks and a causal target mask.

:class:`SDPALanguageModel`: a decoder-only LM whose attention is
``torch.nn.functional.scaled_dot_product_attention`` with a dense boolean (L, L) mask; its module
names equal attnkit's ``TransformerLM``'s with q, k and v apart (the names before attnkit's packed
in-projection), so ``load_state_dict`` takes attnkit's weights through
``attnkit.nn.projection.unpack``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


def sinusoidal(length: int, d_model: int) -> Tensor:
    """(length, d_model) sinusoidal positions as the tutorial computes them (float32)."""
    den = torch.exp(-torch.arange(0, d_model, 2) * math.log(10000) / d_model)
    pos = torch.arange(0, length).reshape(length, 1)
    pe = torch.zeros(length, d_model)
    pe[:, 0::2] = torch.sin(pos * den)
    pe[:, 1::2] = torch.cos(pos * den)
    return pe


class TutorialSeq2Seq(nn.Module):
    """The tutorial's Seq2SeqTransformer (batch first; embeddings tied to the generator when
    ``tie``, as attnkit's trainer configures its model). Shapes: src (B, S), tgt (B, T) ids ->
    logits (B, T, V)."""

    def __init__(
        self,
        vocab: int,
        d_model: int,
        nhead: int,
        layers: int,
        dim_feedforward: int,
        dropout: float,
        pad_id: int,
        norm_first: bool,
        max_len: int = 512,
    ) -> None:
        super().__init__()
        self.pad_id, self.d_model = pad_id, d_model
        self.src_embed = nn.Embedding(vocab, d_model, padding_idx=pad_id)
        self.tgt_embed = self.src_embed
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first"
            warnings.simplefilter("ignore", UserWarning)
            self.transformer = nn.Transformer(
                d_model,
                nhead,
                layers,
                layers,
                dim_feedforward,
                dropout,
                batch_first=True,
                norm_first=norm_first,
            )
        self.generator = nn.Linear(d_model, vocab)
        self.generator.weight = self.src_embed.weight
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal(max_len, d_model), persistent=False)

    def _embed(self, emb: nn.Embedding, ids: Tensor) -> Tensor:
        return self.dropout(emb(ids) * math.sqrt(self.d_model) + self.pe[: ids.shape[1]])

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) -> logits (B, T, V)."""
        t = tgt.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)  # True = masked
        src_pad, tgt_pad = src == self.pad_id, tgt == self.pad_id
        out = self.transformer(
            self._embed(self.src_embed, src),
            self._embed(self.tgt_embed, tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        return self.generator(out)


def seq2seq_state_from_attnkit(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """attnkit ``Seq2SeqTransformer`` weights renamed for :class:`TutorialSeq2Seq`: each
    attention's packed in-projection (``in_proj.weight`` / ``in_proj.bias``, q | k | v as
    torch packs them) becomes torch's ``in_proj_weight`` / ``in_proj_bias``."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        for kind in ("weight", "bias"):
            if key.endswith(f".in_proj.{kind}"):
                key = key[: -len(f".in_proj.{kind}")] + f".in_proj_{kind}"
        out[key] = value
    return out


class _SDPALayer(nn.Module):
    """A pre-norm decoder layer: x + attn(norm1(x)), then x + ff(norm2(x)); GELU."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int) -> None:
        super().__init__()
        self.nhead = nhead
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self.self_attn, name, nn.Linear(d_model, d_model))
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, L, E), mask (L, L) bool, True = may attend -> (B, L, E)."""
        x = x + self.attention(x, mask)
        return x + self.feed_forward(x)

    def checkpointed(self, x: Tensor, mask: Tensor) -> Tensor:
        """``forward`` with each sub-block under ``torch.utils.checkpoint`` (non-reentrant)."""
        x = x + checkpoint(self.attention, x, mask, use_reentrant=False)
        return x + checkpoint(self.feed_forward, x, use_reentrant=False)

    def feed_forward(self, x: Tensor) -> Tensor:
        """linear2(gelu(linear1(norm2(x)))) (B, L, E)."""
        return self.linear2(F.gelu(self.linear1(self.norm2(x))))

    def attention(self, x: Tensor, mask: Tensor) -> Tensor:
        """out_proj(SDPA(norm1(x))) (B, L, E)."""
        b, n, e = x.shape
        a = self.self_attn
        h = self.norm1(x)

        def heads(t: Tensor) -> Tensor:
            return t.view(b, n, self.nhead, e // self.nhead).transpose(1, 2)

        o = F.scaled_dot_product_attention(
            heads(a.q_proj(h)), heads(a.k_proj(h)), heads(a.v_proj(h)), attn_mask=mask
        )
        return a.out_proj(o.transpose(1, 2).reshape(b, n, e))


class SDPALanguageModel(nn.Module):
    """Decoder-only LM with SDPA and a dense boolean mask; module names as attnkit's
    ``TransformerLM`` (pre-norm, GELU, final LayerNorm, generator tied to the embedding)."""

    def __init__(self, vocab: int, d_model: int, nhead: int, layers: int, dim_ff: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(_SDPALayer(d_model, nhead, dim_ff) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.generator = nn.Linear(d_model, vocab)
        self.generator.weight = self.embed.weight
        self.checkpoint_layers = False

    def forward(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """tokens (B, L), mask (L, L) bool (True = may attend) -> logits (B, L, V)."""
        return self.head(self.hidden(tokens, mask))

    def hidden(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """The states (B, L, E) before the final LayerNorm; with ``checkpoint_layers`` (and
        gradients on) each layer's two sub-blocks run under ``torch.utils.checkpoint``
        (non-reentrant), as attnkit's ``TransformerLM`` checkpoints them."""
        n = tokens.shape[1]
        x = self.embed(tokens) * math.sqrt(self.d_model) + sinusoidal(n, self.d_model)
        save = self.checkpoint_layers and torch.is_grad_enabled()
        for layer in self.layers:
            x = layer.checkpointed(x, mask) if save else layer(x, mask)
        return x

    def head(self, x: Tensor) -> Tensor:
        """States (..., E) -> logits (..., V)."""
        return self.generator(self.norm(x))

"""A decoder-only Transformer language model: token embeddings × sqrt(d_model) + sinusoidal
positions, a stack of self-attention layers under a causal mask (the encoder layers of
:mod:`attnkit.nn.transformer`, which also take a KV cache here), and a linear generator.

Shape legend
------------
``B``  batch     ``L``  sequence length (new tokens when a cache is used)
``E``  d_model   ``V``  vocabulary size

Token tensors are integer (B, L); positions equal to ``pad_id`` are never attended to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit.checks import positive_int
from attnkit.masks import causal, from_key_padding_mask
from attnkit.models.decoding import beam_search, greedy_search
from attnkit.nn.cache import KVCache
from attnkit.nn.positional import SinusoidalPositionalEncoding
from attnkit.nn.transformer import TransformerEncoderLayer

__all__ = ["CausalLayer", "LMCache", "LMConfig", "LMStepper", "TransformerLM"]


@dataclass
class LMConfig:
    """Sizes and options of a :class:`TransformerLM`; validated on creation.

    Attributes:
        vocab_size: V. d_model: E. nhead: heads (divides d_model).
        num_layers, dim_feedforward: stack sizes. dropout: in [0, 1).
        max_len: positions of the sinusoidal table built up front (it extends itself).
        pad_id, bos_id, eos_id: special ids in [0, V); pad differs from bos and eos.
        norm_first: pre-norm layers (then a final LayerNorm before the generator).
        activation: "relu" or "gelu". tie_embeddings: the generator reuses the embedding matrix.
    """

    vocab_size: int
    d_model: int = 256
    nhead: int = 4
    num_layers: int = 4
    dim_feedforward: int = 1024
    dropout: float = 0.1
    max_len: int = 1024
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    norm_first: bool = True
    activation: str = "gelu"
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "nhead", "num_layers", "dim_feedforward", "max_len"):
            positive_int(name, getattr(self, name))
        if self.d_model % self.nhead:
            raise ValueError(
                f"d_model: expected a multiple of nhead={self.nhead}, got d_model={self.d_model}"
            )
        checks.probability("dropout", self.dropout)
        for name in ("pad_id", "bos_id", "eos_id"):
            i = getattr(self, name)
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.vocab_size:
                raise ValueError(f"{name}: expected an int in [0, {self.vocab_size}), got {i!r}")
        if self.pad_id in (self.bos_id, self.eos_id):
            raise ValueError(
                f"pad_id: expected an id different from bos_id={self.bos_id} and "
                f"eos_id={self.eos_id}, got {self.pad_id}"
            )
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation: expected 'relu' or 'gelu', got {self.activation!r}")
        for name in ("norm_first", "tie_embeddings"):
            checks.flag(name, getattr(self, name))


class CausalLayer(TransformerEncoderLayer):
    """An encoder layer (self-attention + feed-forward) whose forward also takes a
    self-attention :class:`~attnkit.nn.cache.KVCache`: with one, ``src`` holds only the new
    tokens, their keys/values are appended, and ``mask`` covers (L, L_all)."""

    def forward(self, src: Tensor, mask=None, cache: KVCache | None = None) -> Tensor:
        """src (B, L, E) -> (B, L, E); mask True = may attend."""
        if cache is None:
            return super().forward(src, mask)
        x = src
        if self.norm_first:
            x = x + self._cached_sa(self.norm1(x), mask, cache)
            x = x + self.dropout2(self._ff_block(self.norm2(x)))
        else:
            x = self.norm1(x + self._cached_sa(x, mask, cache))
            x = self.norm2(x + self.dropout2(self._ff_block(x)))
        return x

    def _cached_sa(self, x: Tensor, mask, cache: KVCache) -> Tensor:
        return self.dropout1(self.self_attn(x, mask=mask, cache=cache)[0])


class LMCache:
    """One self-attention :class:`~attnkit.nn.cache.KVCache` per layer of a TransformerLM."""

    def __init__(self, layers: list[KVCache]) -> None:
        self.layers = layers

    @property
    def length(self) -> int:
        """Number of positions processed so far."""
        return self.layers[0].seen

    def reorder(self, index: Tensor) -> None:
        """Select batch rows of every layer's cache; index (B',)."""
        for c in self.layers:
            c.reorder(index)


class TransformerLM(nn.Module):
    """Decoder-only Transformer over token ids (next-token prediction).

    Typical use::

        logits = model(tokens)                                  # (B, L, V), causal
        out = model.generate(prompt, max_new_tokens=20)         # (B, <= 20) ids
        out, score = model.beam_search(prompt, beam_size=4, max_new_tokens=20)
    """

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        if not isinstance(config, LMConfig):
            raise TypeError(f"config: expected an LMConfig, got {type(config).__name__}")
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.positional = SinusoidalPositionalEncoding(c.d_model, c.max_len, c.dropout)
        self.layers = nn.ModuleList(
            CausalLayer(
                c.d_model,
                c.nhead,
                c.dim_feedforward,
                c.dropout,
                c.activation,
                c.layer_norm_eps,
                batch_first=True,
                norm_first=c.norm_first,
            )
            for _ in range(c.num_layers)
        )
        self.norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else None
        self.generator = nn.Linear(c.d_model, c.vocab_size)
        with torch.no_grad():
            nn.init.normal_(self.embed.weight, std=c.d_model**-0.5)
            self.embed.weight[c.pad_id].zero_()
        if c.tie_embeddings:
            self.generator.weight = self.embed.weight

    def _check_tokens(self, name: str, x: object) -> Tensor:
        v = self.config.vocab_size
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor of token ids, got {type(x).__name__}")
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name}: expected an integer tensor of token ids, got dtype {x.dtype}")
        if x.dim() != 2 or 0 in x.shape:
            raise ValueError(f"{name}: expected a non-empty shape (B, L), got {tuple(x.shape)}")
        lo, hi = int(x.min()), int(x.max())
        if lo < 0 or hi >= v:
            raise ValueError(f"{name}: token ids must lie in [0, {v}), got ids in [{lo}, {hi}]")
        return x

    def _head(self, x: Tensor) -> Tensor:
        return self.generator(x if self.norm is None else self.norm(x))

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, L) -> logits (B, L, V); position t sees tokens 0..t (pad never)."""
        tokens = self._check_tokens("tokens", tokens)
        mask = causal() & from_key_padding_mask(tokens == self.config.pad_id)
        x = self.positional(self.embed(tokens) * math.sqrt(self.config.d_model))
        for layer in self.layers:
            x = layer(x, mask)
        return self._head(x)

    def new_cache(self) -> LMCache:
        """Empty per-layer caches for :meth:`decode_step`."""
        return LMCache([layer.self_attn.new_cache() for layer in self.layers])

    def decode_step(self, tokens: Tensor, cache: LMCache) -> Tensor:
        """Incremental decoding: new tokens (B, L) at positions ``cache.length ..`` -> logits
        (B, L, V); equal to the matching rows of :meth:`forward` on the whole prefix."""
        if not isinstance(cache, LMCache):
            raise TypeError(f"cache: expected an LMCache (model.new_cache()), got {cache!r}")
        tokens = self._check_tokens("tokens", tokens)
        x = self.embed(tokens) * math.sqrt(self.config.d_model)
        x = self.positional(x, cache.length)
        mask = causal("bottom_right") if tokens.shape[1] > 1 else None
        for layer, c in zip(self.layers, cache.layers):
            x = layer(x, mask, c)
        return self._head(x)

    def stepper(self, rows: int) -> LMStepper:
        """A decoding session of ``rows`` rows for :mod:`attnkit.models.decoding`."""
        positive_int("rows", rows)
        return LMStepper(self)

    def banned_ids(self) -> tuple[int, ...]:
        """Ids never generated: pad_id and bos_id (unless it equals eos_id)."""
        c = self.config
        return (c.pad_id,) if c.bos_id == c.eos_id else (c.pad_id, c.bos_id)

    @torch.no_grad()
    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int = 20,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue prompt (B, P) ids (no padding): (B, T <= max_new_tokens) new ids, greedy
        when temperature == 0, else sampled (top_k); rows end at eos_id (then pad_id)."""
        prompt = self._check_tokens("prompt", prompt)
        c = self.config
        return greedy_search(
            self.stepper(prompt.shape[0]),
            prompt,
            max_new_tokens,
            eos_id=c.eos_id,
            pad_id=c.pad_id,
            banned=self.banned_ids(),
            temperature=temperature,
            top_k=top_k,
            generator=generator,
        )

    @torch.no_grad()
    def beam_search(
        self,
        prompt: Tensor,
        beam_size: int = 4,
        max_new_tokens: int = 20,
        length_penalty: float = 0.0,
        return_all: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Beam search continuing prompt (B, P); as :func:`attnkit.models.decoding.beam_search`."""
        prompt = self._check_tokens("prompt", prompt)
        positive_int("beam_size", beam_size)
        c = self.config
        return beam_search(
            self.stepper(prompt.shape[0] * beam_size),
            prompt,
            beam_size,
            max_new_tokens,
            eos_id=c.eos_id,
            pad_id=c.pad_id,
            banned=self.banned_ids(),
            length_penalty=length_penalty,
            return_all=return_all,
        )


class LMStepper:
    """One decoding session of a :class:`TransformerLM` (a
    :class:`~attnkit.models.decoding.Stepper`)."""

    def __init__(self, model: TransformerLM) -> None:
        self.model = model
        self.cache = model.new_cache()

    def step(self, tokens: Tensor) -> Tensor:
        """Next tokens (N, T) -> logits (N, T, V)."""
        return self.model.decode_step(tokens, self.cache)

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (N,) of the cache."""
        self.cache.reorder(index)

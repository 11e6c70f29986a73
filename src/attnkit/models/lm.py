"""A decoder-only Transformer language model: token embeddings with positions
(:mod:`attnkit.models.lm_positions`: × sqrt(d_model) + sinusoidal, or GPT-2's learned table), a
stack of self-attention layers under a causal mask (:class:`~attnkit.models.lm_layers.CausalLayer`,
the encoder layers of :mod:`attnkit.nn.transformer` that also take a KV cache), and a linear
generator.

Shape legend
------------
``B``  batch     ``L``  sequence length (new tokens when a cache is used)
``E``  d_model   ``V``  vocabulary size

Token tensors are integer (B, L); positions equal to ``pad_id`` are never attended to.

Packed rows (several sequences in one row, :mod:`attnkit.train.data.packing`): ``forward`` takes
per-token ``doc_ids`` and ``position_ids`` (B, L); attention then stays inside each document
(``document(doc_ids) & causal()``) and positions restart at every document. With
``LMConfig.window`` the causal mask is local: ``sliding_window(window, 0)``, in training and in
cached decoding (whose caches then keep only the last ``window`` keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit.checks import positive_int
from attnkit.masks import Mask, causal, document, from_key_padding_mask, sliding_window
from attnkit.models.decoding import beam_search, greedy_search
from attnkit.models.lm_layers import CausalLayer, LMCache, float32_attention
from attnkit.models.lm_positions import LEARNED_STD, POSITIONS, LMPositions
from attnkit.models.packed import check_ids, positions_from_docs, set_attention_dropout

__all__ = [
    "CausalLayer",
    "LMCache",
    "LMConfig",
    "LMStepper",
    "TransformerLM",
    "float32_attention",
]


@dataclass
class LMConfig:
    """Sizes and options of a :class:`TransformerLM`; validated on creation.

    Attributes:
        vocab_size: V. d_model: E. nhead: heads (divides d_model).
        num_layers, dim_feedforward: stack sizes. dropout: in [0, 1).
        max_len: positions: of the sinusoidal table built up front (it extends itself); of
            the learned table (the most a sequence may have).
        pad_id, bos_id, eos_id: special ids in [0, V); pad differs from bos and eos.
        norm_first: pre-norm layers (then a final LayerNorm before the generator).
        activation: "relu" or "gelu". tie_embeddings: the generator reuses the embedding matrix.
        window: None (causal attention over the whole prefix) or W >= 0: local-causal attention,
            each token sees itself and the W tokens before it (``sliding_window(W, 0)``).
        attention_dropout: dropout on the attention weights (None: ``dropout``).
        bias: biases in every Linear and LayerNorm (False: none, as nanoGPT's ``bias=False``).
        positions: "sinusoidal" (embeddings × sqrt(d_model) + the fixed table) or "learned"
            (GPT-2 / nanoGPT: embeddings unscaled, initialised N(0, 0.02), + a learned
            (max_len, E) table); see :mod:`attnkit.models.lm_positions`.
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
    window: int | None = None
    attention_dropout: float | None = None
    bias: bool = True
    positions: str = "sinusoidal"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "nhead", "num_layers", "dim_feedforward", "max_len"):
            positive_int(name, getattr(self, name))
        if self.window is not None:
            checks.nonnegative_int("window", self.window)
        if self.attention_dropout is not None:
            checks.probability("attention_dropout", self.attention_dropout)
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
        for name in ("norm_first", "tie_embeddings", "bias"):
            checks.flag(name, getattr(self, name))
        checks.choice("positions", self.positions, POSITIONS)


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
        self.positional = LMPositions(c.positions, c.max_len, c.d_model, c.dropout)
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
                bias=c.bias,
            )
            for _ in range(c.num_layers)
        )
        for layer in self.layers:
            layer.self_attn.attention_fn = float32_attention
        self.norm = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias) if c.norm_first else None
        )
        self.generator = nn.Linear(c.d_model, c.vocab_size, bias=c.bias)
        self.checkpoint_layers = False
        """Recompute each layer in the backward pass instead of keeping its activations (a
        training option, not part of the config: see :meth:`hidden`)."""
        set_attention_dropout(self, c.attention_dropout)
        with torch.no_grad():
            std = LEARNED_STD if c.positions == "learned" else c.d_model**-0.5
            nn.init.normal_(self.embed.weight, std=std)
            self.embed.weight[c.pad_id].zero_()
        if c.tie_embeddings:
            self.generator.weight = self.embed.weight

    def _check_tokens(self, name: str, x: object) -> Tensor:
        return self._checked_tokens(name, x)[0]

    def _checked_tokens(self, name: str, x: object) -> tuple[Tensor, bool]:
        """(``x`` checked: integer ids (B, L) in [0, V); whether it holds ``pad_id``), from one
        read of the ids' device (a GPU is waited for once per forward, not three times)."""
        v = self.config.vocab_size
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor of token ids, got {type(x).__name__}")
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name}: expected an integer tensor of token ids, got dtype {x.dtype}")
        if x.dim() != 2 or 0 in x.shape:
            raise ValueError(f"{name}: expected a non-empty shape (B, L), got {tuple(x.shape)}")
        has_pad = (x == self.config.pad_id).any().to(x.dtype)
        lo, hi, pads = torch.stack([x.min(), x.max(), has_pad]).tolist()
        if lo < 0 or hi >= v:
            raise ValueError(f"{name}: token ids must lie in [0, {v}), got ids in [{lo}, {hi}]")
        return x, bool(pads)

    def _head(self, x: Tensor) -> Tensor:
        return self.generator(x if self.norm is None else self.norm(x))

    def _causal(self, alignment: str = "top_left") -> Mask:
        w = self.config.window
        if w is None:
            return causal(alignment)
        return sliding_window(w, 0, alignment=alignment)

    def forward(
        self, tokens: Tensor, doc_ids: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        """tokens (B, L) -> logits (B, L, V); position t sees tokens 0..t (pad never), or the
        last ``window`` + 1 of them.

        Packed rows: ``doc_ids`` (B, L) ints >= 0, one per token: token t sees only the tokens
        of its own document (``document(doc_ids) & causal()``; ``pad_id`` is then an ordinary
        token: give padding a document of its own); ``position_ids`` (B, L) ints >= 0 (default
        with doc_ids: restarting at 0 wherever the document id changes; default without: 0, 1,
        ...)."""
        return self._head(self.hidden(tokens, doc_ids, position_ids))

    def hidden(
        self, tokens: Tensor, doc_ids: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        """The states (B, L, E) the generator reads (before the final LayerNorm): ``forward``
        is ``head(hidden(...))`` (:meth:`head`). Arguments as :meth:`forward`.

        With :attr:`checkpoint_layers` set and gradients on, each layer's two sub-blocks
        (self-attention, feed-forward) run under ``torch.utils.checkpoint``
        (:meth:`CausalLayer.checkpointed`; the RNG state preserved, so dropout draws the same
        masks): only their inputs are kept, their activations are recomputed in the backward
        pass. Same values and gradients, less memory, about one more forward."""
        tokens, has_pad = self._checked_tokens("tokens", tokens)
        if doc_ids is not None:
            doc_ids = check_ids("doc_ids", doc_ids, tokens, "tokens")
        if position_ids is not None:
            position_ids = check_ids("position_ids", position_ids, tokens, "tokens")
            end = int(position_ids.max()) + 1
            self.positional.check_fits("position_ids", end, f"position id {end - 1}")
        elif doc_ids is not None:
            position_ids = positions_from_docs(doc_ids)
        else:
            n = tokens.shape[1]
            self.positional.check_fits("tokens", n, f"a sequence of {n} tokens")
        pad = tokens == self.config.pad_id
        if doc_ids is not None:
            mask = document(doc_ids) & self._causal()
        else:  # a plain causal or band mask keeps the fused paths; padding only when there is some
            mask = self._causal() & from_key_padding_mask(pad) if has_pad else self._causal()
        x = self.positional(self.embed(tokens), position_ids=position_ids)
        save = self.checkpoint_layers and torch.is_grad_enabled()
        for layer in self.layers:
            x = layer.checkpointed(x, mask) if save else layer(x, mask)
        return x

    def head(self, x: Tensor) -> Tensor:
        """States (..., E) from :meth:`hidden` -> logits (..., V): final LayerNorm (pre-norm
        models) and the generator."""
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
        end = cache.length + tokens.shape[1]
        self.positional.check_fits(
            "tokens", end, f"the cache's {cache.length} tokens and {tokens.shape[1]} new ones"
        )
        x = self.positional(self.embed(tokens), cache.length)
        w = self.config.window
        if w is None:
            mask = causal("bottom_right") if tokens.shape[1] > 1 else None
        else:
            mask = self._causal("bottom_right")
        for layer, c in zip(self.layers, cache.layers):
            x = layer(x, mask, c)
        if w is not None:
            cache.keep_last(w)
        return self._head(x)

    def stepper(self, rows: int) -> LMStepper:
        """A decoding session of ``rows`` rows for :mod:`attnkit.models.decoding`."""
        positive_int("rows", rows)
        return LMStepper(self)

    def banned_ids(self) -> tuple[int, ...]:
        """Ids never generated: pad_id and bos_id (unless it equals eos_id)."""
        c = self.config
        return (c.pad_id,) if c.bos_id == c.eos_id else (c.pad_id, c.bos_id)

    def _check_room(self, prompt: object, max_new_tokens: object) -> Tensor:
        """The checked prompt (B, P); with learned positions, ValueError unless the prompt and
        the tokens fed back (all new ones but the last) fit the table, before any work."""
        prompt = self._check_tokens("prompt", prompt)
        n = positive_int("max_new_tokens", max_new_tokens)
        end = prompt.shape[1] + n - 1
        what = f"a prompt of {prompt.shape[1]} tokens and {n} new ones"
        self.positional.check_fits("max_new_tokens", end, what)
        return prompt

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
        prompt = self._check_room(prompt, max_new_tokens)
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
        prompt = self._check_room(prompt, max_new_tokens)
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

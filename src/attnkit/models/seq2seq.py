"""An encoder–decoder Transformer for sequence-to-sequence tasks (Vaswani et al., 2017):
token embeddings × sqrt(d_model) + sinusoidal positions, :class:`attnkit.nn.transformer.Transformer`
and a linear generator producing target-vocabulary logits.

Shape legend
------------
``B``  batch     ``S``  source length     ``T``  target length (new tokens when a cache is used)
``E``  d_model   ``V``  target vocabulary size

Token tensors are integer (B, L). Padding: source positions are padding where ``src == pad_id``
(or, when ``src_lengths`` (B,) is given, positions ``>= src_lengths[b]``); padded source
positions are never attended to. Target padding is found from ``pad_id`` the same way.

Packed rows (several pairs in one row, :mod:`attnkit.train.data.packing`): ``forward`` takes
``src_doc_ids`` (B, S) and ``tgt_doc_ids`` (B, T), and optionally ``src_position_ids`` /
``tgt_position_ids``: the encoder attends with ``document(src_doc_ids)``, the decoder with
``document(tgt_doc_ids) & causal()``, cross-attention with ``document(tgt_doc_ids,
src_doc_ids)`` (target document d sees source document d), and positions restart at every
document.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit.masks import Mask, causal
from attnkit.models.decoding import beam_search, greedy_search
from attnkit.models.packed import forward_packed, set_attention_dropout
from attnkit.models.padding_masks import causal_padding_mask, lengths_mask, padding_mask
from attnkit.nn.cache import DecoderCache
from attnkit.nn.positional import SinusoidalPositionalEncoding
from attnkit.nn.transformer import Transformer

__all__ = ["Seq2SeqConfig", "Seq2SeqStepper", "Seq2SeqTransformer"]

_TIES = ("none", "decoder", "all")


@dataclass
class Seq2SeqConfig:
    """Sizes and options of a :class:`Seq2SeqTransformer`; validated on creation.

    Attributes:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        d_model: E; nhead: heads (divides d_model).
        num_encoder_layers, num_decoder_layers, dim_feedforward: stack sizes.
        dropout: in [0, 1); used after the positional encoding and inside every layer.
        max_len: positions of the sinusoidal table built up front and the default length limit
            of :meth:`Seq2SeqTransformer.greedy_decode` (longer inputs still work: the table
            extends itself).
        pad_id, bos_id, eos_id: special token ids; pad_id is valid in both vocabularies and
            differs from bos_id and eos_id; bos_id and eos_id are target ids.
        tie_embeddings: "none" (three separate matrices), "decoder" (target embedding and
            generator share one matrix) or "all" (source embedding, target embedding and
            generator share one matrix; needs src_vocab_size == tgt_vocab_size).
        norm_first: pre-norm layers (False: the paper's post-norm).
        activation: "relu" or "gelu".
        layer_norm_eps: LayerNorm epsilon.
        attention_dropout: dropout on the attention weights (None: ``dropout``); 0 lets the
            blocksparse kernel (no dropout) run packed training steps.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    nhead: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.1
    max_len: int = 1024
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    tie_embeddings: str = "decoder"
    norm_first: bool = False
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    attention_dropout: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "src_vocab_size",
            "tgt_vocab_size",
            "d_model",
            "nhead",
            "num_encoder_layers",
            "num_decoder_layers",
            "dim_feedforward",
            "max_len",
        ):
            checks.positive_int(name, getattr(self, name))
        if self.d_model % self.nhead:
            raise ValueError(
                f"d_model: expected a multiple of nhead={self.nhead}, got d_model={self.d_model}"
            )
        d = self.dropout
        checks.probability("dropout", d)
        if self.attention_dropout is not None:
            checks.probability("attention_dropout", self.attention_dropout)
        for name, vocab in (
            ("pad_id", min(self.src_vocab_size, self.tgt_vocab_size)),
            ("bos_id", self.tgt_vocab_size),
            ("eos_id", self.tgt_vocab_size),
        ):
            i = getattr(self, name)
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < vocab:
                raise ValueError(f"{name}: expected an int in [0, {vocab}), got {i!r}")
        if self.pad_id in (self.bos_id, self.eos_id):
            raise ValueError(
                f"pad_id: expected an id different from bos_id={self.bos_id} and "
                f"eos_id={self.eos_id}, got {self.pad_id}"
            )
        if self.tie_embeddings not in _TIES:
            raise ValueError(
                f"tie_embeddings: expected one of {_TIES}, got {self.tie_embeddings!r}"
            )
        if self.tie_embeddings == "all" and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "tie_embeddings: 'all' shares one matrix between source and target, so it needs "
                f"a shared vocabulary, got src_vocab_size={self.src_vocab_size}, "
                f"tgt_vocab_size={self.tgt_vocab_size}"
            )
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation: expected 'relu' or 'gelu', got {self.activation!r}")
        checks.flag("norm_first", self.norm_first)


class Seq2SeqTransformer(nn.Module):
    """Encoder–decoder Transformer over token ids.

    Submodules: ``src_embed`` / ``tgt_embed`` (``nn.Embedding``, the same module when
    ``tie_embeddings == "all"``), ``positional`` (sinusoidal, no parameters), ``transformer``
    (:class:`~attnkit.nn.transformer.Transformer`, batch first) and ``generator``
    (``nn.Linear(d_model, tgt_vocab_size)``, with bias; its weight is ``tgt_embed.weight`` when
    tied). Embeddings start as N(0, d_model^-1/2), so embedding × sqrt(d_model) has unit scale.

    Typical use::

        logits = model(src, tgt_in)                  # (B, T, V), teacher forcing
        out = model.greedy_decode(src, max_len=50)   # (B, <= 50) token ids
        out, score = model.beam_search(src, beam_size=4, max_len=50)

        memory, src_mask = model.encode(src)         # step by step, with a KV cache
        cache = model.new_cache()
        logits = model.decode_step(bos_column, memory, src_mask, cache)   # (B, 1, V)
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        if not isinstance(config, Seq2SeqConfig):
            raise TypeError(f"config: expected a Seq2SeqConfig, got {type(config).__name__}")
        c = self.config = config
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        if c.tie_embeddings == "all":
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.positional = SinusoidalPositionalEncoding(c.d_model, c.max_len, c.dropout)
        self.transformer = Transformer(
            d_model=c.d_model,
            nhead=c.nhead,
            num_encoder_layers=c.num_encoder_layers,
            num_decoder_layers=c.num_decoder_layers,
            dim_feedforward=c.dim_feedforward,
            dropout=c.dropout,
            activation=c.activation,
            layer_norm_eps=c.layer_norm_eps,
            batch_first=True,
            norm_first=c.norm_first,
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        set_attention_dropout(self, c.attention_dropout)
        with torch.no_grad():
            for emb in {id(m): m for m in (self.src_embed, self.tgt_embed)}.values():
                nn.init.normal_(emb.weight, std=c.d_model**-0.5)
                emb.weight[c.pad_id].zero_()
        if c.tie_embeddings in ("decoder", "all"):
            self.generator.weight = self.tgt_embed.weight

    # --- inputs ---------------------------------------------------------------------------
    def _check_tokens(self, name: str, x: object, vocab: int) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor of token ids, got {type(x).__name__}")
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name}: expected an integer tensor of token ids, got dtype {x.dtype}")
        if x.dim() != 2 or 0 in x.shape:
            raise ValueError(f"{name}: expected a non-empty shape (B, L), got {tuple(x.shape)}")
        lo, hi = torch.stack([x.min(), x.max()]).tolist()  # one read of the ids' device
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{name}: token ids must lie in [0, {vocab}), got ids in [{lo}, {hi}]")
        return x

    def _embed(self, emb: nn.Embedding, tokens: Tensor, offset: int = 0) -> Tensor:
        """(B, L) ids -> (B, L, E): embedding × sqrt(E) + positions offset .. offset + L - 1."""
        return self.positional(emb(tokens) * math.sqrt(self.config.d_model), offset)

    def source_mask(self, src: Tensor, src_lengths: Tensor | None = None) -> Mask:
        """Mask of the valid source keys (batch_shape (B,)): ``key_padding(src_lengths)`` when
        lengths are given, else every position whose id is not ``pad_id``; one object per padding
        pattern (:mod:`attnkit.models.padding_masks`)."""
        if src_lengths is None:
            return padding_mask(src, self.config.pad_id)
        lengths = torch.as_tensor(src_lengths)
        if lengths.is_floating_point() or lengths.dtype == torch.bool:
            raise TypeError(f"src_lengths: expected integer lengths, got dtype {lengths.dtype}")
        b, s = src.shape
        if lengths.shape != (b,) or int(lengths.min()) < 1 or int(lengths.max()) > s:
            raise ValueError(
                f"src_lengths: expected (B,) = ({b},) lengths in [1, {s}], got "
                f"shape {tuple(lengths.shape)} values {lengths.tolist()}"
            )
        return lengths_mask(tuple(lengths.tolist()))

    # --- model ----------------------------------------------------------------------------
    def encode(self, src: Tensor, src_lengths: Tensor | None = None) -> tuple[Tensor, Mask]:
        """src (B, S) ids -> (memory (B, S, E), source mask for :meth:`decode` /
        :meth:`decode_step`)."""
        src = self._check_tokens("src", src, self.config.src_vocab_size)
        mask = self.source_mask(src, src_lengths)
        return self.transformer.encode(self._embed(self.src_embed, src), mask), mask

    def decode(self, tgt: Tensor, memory: Tensor, memory_mask: Mask | None = None) -> Tensor:
        """Full causal decoding (teacher forcing): tgt (B, T) ids, memory (B, S, E) ->
        logits (B, T, V). Target positions equal to ``pad_id`` are hidden as keys."""
        tgt = self._check_tokens("tgt", tgt, self.config.tgt_vocab_size)
        tgt_mask = causal_padding_mask(tgt, self.config.pad_id)
        y = self.transformer.decode(self._embed(self.tgt_embed, tgt), memory, tgt_mask, memory_mask)
        return self.generator(y)

    def new_cache(self) -> DecoderCache:
        """An empty decoder cache for :meth:`decode_step`."""
        return self.transformer.new_cache()

    def decode_step(
        self, tokens: Tensor, memory: Tensor, memory_mask: Mask | None, cache: DecoderCache
    ) -> Tensor:
        """Incremental decoding: the next target tokens (B, T) (usually T = 1) -> logits (B, T, V).

        Their positions start at ``cache.length`` (the tokens decoded so far); their keys and
        values are appended to ``cache`` (from :meth:`new_cache`). The result equals the
        matching rows of :meth:`decode` on the whole prefix (targets without padding).
        """
        if not isinstance(cache, DecoderCache):
            raise TypeError(f"cache: expected a DecoderCache (model.new_cache()), got {cache!r}")
        tokens = self._check_tokens("tokens", tokens, self.config.tgt_vocab_size)
        x = self._embed(self.tgt_embed, tokens, offset=cache.length)
        tgt_mask = causal("bottom_right") if tokens.shape[1] > 1 else None
        y = self.transformer.decode(x, memory, tgt_mask, memory_mask, cache)
        return self.generator(y)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_lengths: Tensor | None = None,
        *,
        src_doc_ids: Tensor | None = None,
        tgt_doc_ids: Tensor | None = None,
        src_position_ids: Tensor | None = None,
        tgt_position_ids: Tensor | None = None,
    ) -> Tensor:
        """src (B, S) ids, tgt (B, T) ids (decoder input, starting with bos_id) ->
        logits (B, T, V). ``src_lengths`` (B,): valid source lengths (default: from pad_id).

        Packed rows: ``src_doc_ids`` (B, S) and ``tgt_doc_ids`` (B, T) ints >= 0 (both or
        neither; not with src_lengths): see the module docstring; ``pad_id`` is then an
        ordinary token (give padding documents of its own). ``*_position_ids``: ints >= 0 of
        the same shapes (default: restarting at 0 wherever the document id changes)."""
        src = self._check_tokens("src", src, self.config.src_vocab_size)
        tgt = self._check_tokens("tgt", tgt, self.config.tgt_vocab_size)
        if tgt.shape[0] != src.shape[0]:
            raise ValueError(f"tgt: batch size {tgt.shape[0]} differs from src's {src.shape[0]}")
        packed = (src_doc_ids, tgt_doc_ids, src_position_ids, tgt_position_ids)
        if all(x is None for x in packed):
            memory, mask = self.encode(src, src_lengths)
            return self.decode(tgt, memory, mask)
        return forward_packed(self, src, tgt, src_lengths, *packed)

    # --- generation -----------------------------------------------------------------------
    def next_token_logprobs(self, logits: Tensor) -> Tensor:
        """log_softmax of logits (..., V) over the tokens a generator may emit: pad_id and
        bos_id get -inf (unless bos_id == eos_id)."""
        c = self.config
        logits = logits.clone()
        logits[..., c.pad_id] = -math.inf
        if c.bos_id != c.eos_id:
            logits[..., c.bos_id] = -math.inf
        return torch.log_softmax(logits, dim=-1)

    def _start(self, src: object, max_len: object) -> tuple[Tensor, int]:
        max_len = self.config.max_len if max_len is None else max_len
        checks.positive_int("max_len", max_len)
        src = self._check_tokens("src", src, self.config.src_vocab_size)
        return src, max_len

    def stepper(
        self, src: Tensor, src_lengths: Tensor | None = None, repeat: int = 1
    ) -> Seq2SeqStepper:
        """A decoding session for :mod:`attnkit.models.decoding`: encodes src (B, S) once and
        serves B*repeat rows (row ``b*repeat + j`` decodes source ``b``; repeat = beam size)."""
        src = self._check_tokens("src", src, self.config.src_vocab_size)
        checks.positive_int("repeat", repeat)
        memory, _ = self.encode(src, src_lengths)
        lengths = None if src_lengths is None else torch.as_tensor(src_lengths)
        mask = self.source_mask(
            src.repeat_interleave(repeat, dim=0),
            None if lengths is None else lengths.repeat_interleave(repeat),
        )
        return Seq2SeqStepper(self, memory.repeat_interleave(repeat, dim=0), mask)

    def banned_ids(self) -> tuple[int, ...]:
        """Ids a generator never emits: pad_id, and bos_id unless it equals eos_id."""
        c = self.config
        return (c.pad_id,) if c.bos_id == c.eos_id else (c.pad_id, c.bos_id)

    def _bos(self, src: Tensor) -> Tensor:
        return torch.full(
            (src.shape[0], 1), self.config.bos_id, dtype=torch.long, device=src.device
        )

    @torch.no_grad()
    def greedy_decode(
        self, src: Tensor, max_len: int | None = None, src_lengths: Tensor | None = None
    ) -> Tensor:
        """Greedy decoding with the KV cache: src (B, S) ids -> (B, T) generated ids, T <= max_len
        (default ``config.max_len``), without the leading bos_id. Each row ends with eos_id
        (followed by pad_id) unless it reached max_len first; stops when every row has ended.
        pad_id and bos_id are never generated. Call ``model.eval()`` first (dropout).
        (:func:`attnkit.models.decoding.greedy_search` over :meth:`stepper`.)
        """
        c = self.config
        src, max_len = self._start(src, max_len)
        return greedy_search(
            self.stepper(src, src_lengths),
            self._bos(src),
            max_len,
            eos_id=c.eos_id,
            pad_id=c.pad_id,
            banned=self.banned_ids(),
        )

    @torch.no_grad()
    def beam_search(
        self,
        src: Tensor,
        beam_size: int = 4,
        max_len: int | None = None,
        src_lengths: Tensor | None = None,
        length_penalty: float = 0.0,
        return_all: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Beam search with the KV cache (reordered as beams are chosen);
        :func:`attnkit.models.decoding.beam_search` over :meth:`stepper`.

        A hypothesis ends at eos_id or after ``max_len`` tokens; the best one per source maximises
        ``sum(log p) / len ** length_penalty`` (len counts the eos; 0 = plain sum of
        log-probabilities). pad_id and bos_id are never generated. With ``beam_size`` at least
        the number of possible hypotheses the search is exhaustive.

        Args:
            src: (B, S) source ids; src_lengths: (B,) as in :meth:`forward`.
            beam_size: K >= 1 hypotheses kept per source.
            return_all: return all K final hypotheses, best first, instead of the best one.
        Returns:
            (tokens (B, T) without the leading bos_id, padded with pad_id after eos_id;
            scores (B,) the normalised score of each returned hypothesis); with ``return_all``
            tokens (B, K, T) and scores (B, K), best first (a slot with score -inf holds no
            hypothesis: fewer than K exist).
        """
        c = self.config
        src, max_len = self._start(src, max_len)
        checks.positive_int("beam_size", beam_size)
        checks.finite_float("length_penalty", length_penalty)
        return beam_search(
            self.stepper(src, src_lengths, repeat=beam_size),
            self._bos(src),
            beam_size,
            max_len,
            eos_id=c.eos_id,
            pad_id=c.pad_id,
            banned=self.banned_ids(),
            length_penalty=length_penalty,
            return_all=return_all,
        )


class Seq2SeqStepper:
    """One decoding session of a :class:`Seq2SeqTransformer` (a
    :class:`~attnkit.models.decoding.Stepper`): the encoded memory (N, S, E), its mask and a
    fresh decoder cache."""

    def __init__(self, model: Seq2SeqTransformer, memory: Tensor, mask: Mask) -> None:
        self.model, self.memory, self.mask = model, memory, mask
        self.cache = model.new_cache()

    def step(self, tokens: Tensor) -> Tensor:
        """Next target tokens (N, T) -> logits (N, T, V)."""
        return self.model.decode_step(tokens, self.memory, self.mask, self.cache)

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (N,) of the decoder cache."""
        self.cache.reorder(index)

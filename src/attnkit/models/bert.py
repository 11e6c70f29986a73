"""A BERT-family encoder (BERT, MiniLM, all-MiniLM-L6-v2) loaded from a local directory.

Reads a HuggingFace-layout directory with ``safetensors`` and ``tokenizers`` only (no
``transformers`` at run time, no pickle, no download):

- ``config.json``: BERT config (absolute positions, token types, GELU (erf), post-norm).
- ``model.safetensors``: weights with HuggingFace ``BertModel`` names (an optional ``bert.``
  prefix is accepted; the pooler, MLM heads and ``position_ids`` are ignored).
- ``tokenizer.json`` or else ``vocab.txt`` (+ ``tokenizer_config.json`` for lower-casing).
- optional sentence-transformers files: ``modules.json`` (Transformer / Pooling / Normalize),
  ``1_Pooling/config.json`` (mean pooling), ``sentence_bert_config.json`` (``max_seq_length``).

Shape legend: ``B`` batch, ``L`` sequence length (tokens, padded to the batch maximum), ``E``
hidden size, ``H`` attention heads, ``N`` number of texts.

Example::

    from attnkit.models import BertModel, default_model_path
    model = BertModel.from_pretrained(default_model_path())
    model.embed(["A cat sat.", "A dog ran."]).shape     # torch.Size([2, 384])
    batch = model.tokenize(["A cat sat."])
    out = model(batch.input_ids, batch.attention_mask, output_attentions=True)
    out.attentions[0].shape                             # torch.Size([1, 12, 6, 6])
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from torch import Tensor, nn

from attnkit.masks import Mask, from_key_padding_mask
from attnkit.nn.transformer import TransformerEncoderLayer

__all__ = ["BertConfig", "BertInputs", "BertModel", "BertOutput", "SentencePooling"]


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------
def _read_json(path: Path) -> object:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


@dataclass(frozen=True)
class BertConfig:
    """The parts of a HuggingFace BERT ``config.json`` this encoder uses."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0

    _INT_KEYS = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    )

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> BertConfig:
        """Validate a config dict; ``source`` names it in error messages.

        Raises ValueError for a missing key or an unsupported value (model_type other than
        "bert", position_embedding_type other than "absolute", hidden_act other than "gelu",
        decoder / cross-attention configs)."""
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(d).__name__}")
        supported = {
            "model_type": ("bert",),
            "position_embedding_type": ("absolute",),
            "hidden_act": ("gelu",),
            "is_decoder": (False,),
            "add_cross_attention": (False,),
        }
        for key, ok in supported.items():
            if key in d and d[key] not in ok:
                raise ValueError(
                    f"{source}: unsupported {key}={d[key]!r}; this BERT encoder supports "
                    f"{key} in {list(ok)}"
                )
        missing = [k for k in cls._INT_KEYS[:-1] if k not in d]
        if missing:
            raise ValueError(f"{source}: missing required key(s) {missing}")
        kw: dict = {}
        for k in cls._INT_KEYS:
            if k not in d:
                continue
            v = d[k]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{source}: {k} must be a positive int, got {v!r}")
            kw[k] = v
        if kw["hidden_size"] % kw["num_attention_heads"]:
            raise ValueError(
                f"{source}: hidden_size={kw['hidden_size']} is not divisible by "
                f"num_attention_heads={kw['num_attention_heads']}"
            )
        for k in ("layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob"):
            if k in d:
                v = d[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"{source}: {k} must be a finite number, got {v!r}")
                lo_ok = v > 0 if k == "layer_norm_eps" else 0 <= v < 1
                if not lo_ok:
                    raise ValueError(f"{source}: {k} out of range, got {v!r}")
                kw[k] = float(v)
        pad = d.get("pad_token_id", 0)
        if pad is not None:
            if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad < kw["vocab_size"]:
                raise ValueError(
                    f"{source}: pad_token_id must be an int in [0, vocab_size), got {pad!r}"
                )
            kw["pad_token_id"] = pad
        return cls(**kw)

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """Read and validate a ``config.json``."""
        path = Path(path)
        return cls.from_dict(_read_json(path), str(path))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class SentencePooling:
    """How sentence-transformers turns token states into a sentence embedding.

    ``mode`` is "mean" (average over non-padding tokens); ``normalize`` says whether the
    embedding is L2-normalised; ``max_seq_length`` is the truncation length in tokens.
    ``unsupported`` lists modules of ``modules.json`` this encoder cannot run (``embed`` then
    refuses, the encoder itself still works)."""

    mode: str = "mean"
    normalize: bool = False
    max_seq_length: int = 512
    unsupported: tuple[str, ...] = ()

    @classmethod
    def from_dir(cls, path: Path, max_positions: int) -> SentencePooling:
        """Read ``modules.json``, the pooling config and ``sentence_bert_config.json`` under
        ``path``; without ``modules.json``: mean pooling, no normalisation."""
        max_len = max_positions
        sbert = path / "sentence_bert_config.json"
        if sbert.is_file():
            v = _read_json(sbert)
            n = v.get("max_seq_length") if isinstance(v, dict) else None
            if n is not None:
                if not isinstance(n, int) or isinstance(n, bool) or n < 2:
                    raise ValueError(f"{sbert}: max_seq_length must be an int >= 2, got {n!r}")
                max_len = min(n, max_positions)
        modules_file = path / "modules.json"
        if not modules_file.is_file():
            return cls(max_seq_length=max_len)
        modules = _read_json(modules_file)
        if not isinstance(modules, list):
            raise ValueError(f"{modules_file}: expected a JSON list of modules")
        mode, normalize, unsupported = "mean", False, []
        for m in modules:
            kind = str(m.get("type", "")) if isinstance(m, dict) else ""
            short = kind.rsplit(".", 1)[-1]
            if short == "Transformer":
                continue
            if short == "Normalize":
                normalize = True
            elif short == "Pooling":
                pool_file = path / str(m.get("path", "")) / "config.json"
                mode = cls._pooling_mode(_read_json(pool_file), pool_file)
            else:
                unsupported.append(kind or repr(m))
        return cls(mode, normalize, max_len, tuple(unsupported))

    @staticmethod
    def _pooling_mode(cfg: object, source: Path) -> str:
        if not isinstance(cfg, dict):
            raise ValueError(f"{source}: expected a JSON object")
        if "pooling_mode" in cfg:
            modes = [cfg["pooling_mode"]]
        else:
            modes = [
                k[len("pooling_mode_") :]
                for k, v in cfg.items()
                if k.startswith("pooling_mode_") and v
            ]
        if modes not in (["mean"], ["mean_tokens"]):
            return f"unsupported:{'+'.join(map(str, modes)) or 'none'}"
        return "mean"


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------
def _load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """``tokenizer.json``, or a BERT WordPiece tokenizer built from ``vocab.txt``; set to
    truncate to ``max_length`` tokens and not to pad (padding is done per batch)."""
    tj, vocab = path / "tokenizer.json", path / "vocab.txt"
    if tj.is_file():
        try:
            tok = Tokenizer.from_file(str(tj))
        except Exception as e:  # tokenizers raises a bare Exception on bad files
            raise ValueError(f"{tj}: cannot be read as a tokenizers file ({e})") from None
    elif vocab.is_file():
        cfg_file = path / "tokenizer_config.json"
        cfg = _read_json(cfg_file) if cfg_file.is_file() else {}
        lower = bool(cfg.get("do_lower_case", True)) if isinstance(cfg, dict) else True
        tok = Tokenizer(WordPiece.from_file(str(vocab), unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lower
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        ids = {t: tok.token_to_id(t) for t in ("[CLS]", "[SEP]")}
        if None in ids.values():
            raise ValueError(f"{vocab}: lacks the special tokens [CLS] / [SEP]")
        tok.post_processor = processors.BertProcessing(
            ("[SEP]", ids["[SEP]"]), ("[CLS]", ids["[CLS]"])
        )
        tok.decoder = decoders.WordPiece()
    else:
        raise FileNotFoundError(f"{path}: no tokenizer.json or vocab.txt found")
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok


@dataclass(frozen=True)
class BertInputs:
    """A tokenized, right-padded batch, each tensor (B, L) int64: ``input_ids``,
    ``attention_mask`` (1 = real token, 0 = padding), ``token_type_ids``,
    ``special_tokens_mask`` (1 = [CLS] / [SEP] / padding); ``tokens``: the B lists of token
    strings (without padding)."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    special_tokens_mask: Tensor
    tokens: list[list[str]]


# ---------------------------------------------------------------------------------------------
# modules
# ---------------------------------------------------------------------------------------------
def _embedding(n: int, e: int) -> nn.Embedding:
    """nn.Embedding initialised N(0, 0.02) like BERT; on the meta device (shapes only, as
    :meth:`BertModel.from_pretrained` builds it) nothing is initialised."""
    w = torch.empty(n, e)
    if not w.is_meta:
        nn.init.normal_(w, std=0.02)
    return nn.Embedding(n, e, _weight=w)


class BertEmbeddings(nn.Module):
    """LayerNorm(word + absolute position + token type embeddings), then dropout: (B, L) ids ->
    (B, L, E)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        e = config.hidden_size
        self.word_embeddings = _embedding(config.vocab_size, e)
        self.position_embeddings = _embedding(config.max_position_embeddings, e)
        self.token_type_embeddings = _embedding(config.type_vocab_size, e)
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.dropout(self.norm(x))


class BertLayer(TransformerEncoderLayer):
    """One BERT block: :class:`attnkit.nn.transformer.TransformerEncoderLayer` (post-norm,
    GELU) whose :meth:`attend` also returns the per-head attention weights::

        x = norm1(x + dropout1(self_attn(x)))
        x = norm2(x + dropout2(linear2(gelu(linear1(x)))))

    Unlike torch's layer there is no dropout between the activation and ``linear2`` (BERT has
    none there; this only matters in training mode). The attention-probability dropout is the
    config's ``attention_probs_dropout_prob``.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__(
            config.hidden_size,
            config.num_attention_heads,
            config.intermediate_size,
            dropout=config.hidden_dropout_prob,
            activation="gelu",
            layer_norm_eps=config.layer_norm_eps,
            batch_first=True,
            norm_first=False,
        )
        self.self_attn.dropout = config.attention_probs_dropout_prob

    def attend(
        self, x: Tensor, mask: Mask | None = None, return_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, L, E) -> ((B, L, E), weights (B, H, L, L) or None); mask: True = may
        attend."""
        a, w = self.self_attn(x, mask=mask, return_weights=return_weights)
        x = self.norm1(x + self.dropout1(a))
        f = self.linear2(F.gelu(self.linear1(x)))
        return self.norm2(x + self.dropout2(f)), w

    def forward(self, src: Tensor, mask: Mask | None = None) -> Tensor:
        """src: (B, L, E) -> (B, L, E)."""
        return self.attend(src, mask)[0]


@dataclass
class BertOutput:
    """``last_hidden_state`` (B, L, E); ``attentions``: one (B, H, L, L) tensor per layer when
    asked for (``output_attentions=True``), else None."""

    last_hidden_state: Tensor
    attentions: tuple[Tensor, ...] | None = None


# HuggingFace BertModel parameter names -> ours (without the optional "bert." prefix).
_RENAMES: tuple[tuple[str, str], ...] = (
    (
        r"embeddings\.(word|position|token_type)_embeddings\.weight",
        r"embeddings.\1_embeddings.weight",
    ),
    (r"embeddings\.LayerNorm\.", r"embeddings.norm."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.", r"layers.\1.self_attn.q_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.", r"layers.\1.self_attn.k_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.", r"layers.\1.self_attn.v_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.self_attn.out_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.norm1."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.linear1."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.linear2."),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.norm2."),
)
_IGNORED = re.compile(r"(embeddings\.position_ids|pooler\..*|cls\..*)")


def _rename(name: str) -> str | None:
    """Our parameter name for a HuggingFace weight name; "" for weights we ignore; None when
    the name is not recognised."""
    if name.startswith("bert."):
        name = name[len("bert.") :]
    if _IGNORED.fullmatch(name):
        return ""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    for pat, rep in _RENAMES:
        m = re.match(pat, name)
        if m:
            return m.expand(rep) + name[m.end() :]
    return None


def _first(items: Sequence[str], n: int = 5) -> str:
    more = f", ... ({len(items)} in all)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------
class BertModel(nn.Module):
    """BERT encoder: embeddings, then ``num_hidden_layers`` post-norm blocks of
    :class:`attnkit.nn.transformer.TransformerEncoderLayer` (post-norm, GELU).

    Build with :meth:`from_pretrained`; call as ``model(input_ids, attention_mask)``; sentence
    embeddings with :meth:`embed`. A loaded model is in eval mode.
    """

    def __init__(
        self,
        config: BertConfig,
        tokenizer: Tokenizer | None = None,
        pooling: SentencePooling | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"config: expected a BertConfig, got {type(config).__name__}")
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.tokenizer = tokenizer
        self.pooling = pooling or SentencePooling(max_seq_length=config.max_position_embeddings)
        self.name_or_path = ""

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype = torch.float32) -> BertModel:
        """Load a HuggingFace-layout directory (see the module docstring for the files read);
        floating weights are converted to ``dtype``.

        Raises:
            FileNotFoundError: the directory or a required file is missing.
            ValueError: an unsupported config value, an unreadable file, or weights whose names
                or shapes do not match the config (the first few are listed). No partially
                loaded model is ever returned.
        """
        if not isinstance(path, (str, Path)):
            raise TypeError(f"path: expected a directory path, got {type(path).__name__}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
        path = Path(path).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"path: {str(path)!r} is not a directory (the bundled all-MiniLM-L6-v2 is at "
                "attnkit.models.default_model_path())"
            )
        config = BertConfig.from_json(path / "config.json")
        weights_file = path / "model.safetensors"
        if not weights_file.is_file():
            raise FileNotFoundError(
                f"{weights_file}: file not found (only safetensors weights are read, never "
                "pickle files such as pytorch_model.bin)"
            )
        pooling = SentencePooling.from_dir(path, config.max_position_embeddings)
        tokenizer = _load_tokenizer(path, pooling.max_seq_length)
        try:
            raw = load_file(str(weights_file))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{weights_file}: cannot be read as safetensors ({e})") from None
        with torch.device("meta"):  # shapes only: no memory, no random init
            model = cls(config, tokenizer, pooling)
        state = _map_state_dict(raw, model, weights_file, dtype)
        model.load_state_dict(state, strict=True, assign=True)
        left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
        if left:  # cannot happen with strict loading; never hand out a half-built model
            raise ValueError(f"{weights_file}: weights not loaded: {_first(left)}")
        model.name_or_path = str(path)
        return model.eval()

    # --- tokenizing ---------------------------------------------------------------------------
    def _require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer; load it with BertModel.from_pretrained")
        return self.tokenizer

    def _encode(self, texts: str | Sequence[str]) -> list:
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts: expected a str or a sequence of str")
        if len(texts) == 0:
            raise ValueError("texts: expected at least one text, got an empty sequence")
        return self._require_tokenizer().encode_batch(list(texts))

    def _pad_id(self) -> int:
        tok = self._require_tokenizer()
        pid = tok.token_to_id("[PAD]")
        return self.config.pad_token_id if pid is None else pid

    def _collate(self, encodings: Sequence) -> tuple[Tensor, Tensor, Tensor]:
        """Right-pad encodings to their longest: three (B, L) int64 tensors."""
        n = max(len(e.ids) for e in encodings)
        pad = self._pad_id()
        ids = torch.tensor([e.ids + [pad] * (n - len(e.ids)) for e in encodings])
        types = torch.tensor([e.type_ids + [0] * (n - len(e.ids)) for e in encodings])
        att = torch.tensor([[1] * len(e.ids) + [0] * (n - len(e.ids)) for e in encodings])
        return ids, att, types

    def tokenize(self, texts: str | Sequence[str]) -> BertInputs:
        """Tokenize texts ([CLS] text [SEP]), truncated to ``pooling.max_seq_length`` tokens
        (the sentence-transformers max_seq_length, else max_position_embeddings) and
        right-padded to the longest in the batch: tensors (B, L)."""
        enc = self._encode(texts)
        ids, att, types = self._collate(enc)
        n = ids.shape[1]
        special = torch.tensor([e.special_tokens_mask + [1] * (n - len(e.ids)) for e in enc])
        return BertInputs(ids, att, types, special, [list(e.tokens) for e in enc])

    # --- forward ------------------------------------------------------------------------------
    def _check_inputs(
        self, input_ids: object, attention_mask: object, token_type_ids: object
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        cfg = self.config
        if (
            not isinstance(input_ids, Tensor)
            or input_ids.is_floating_point()
            or input_ids.dtype
            in (
                torch.bool,
                torch.complex64,
                torch.complex128,
            )
        ):
            got = input_ids.dtype if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise TypeError(f"input_ids: expected an integer torch.Tensor (B, L), got {got}")
        if input_ids.dim() != 2 or 0 in input_ids.shape:
            raise ValueError(
                f"input_ids: expected a non-empty (B, L) tensor, got shape {tuple(input_ids.shape)}"
            )
        if input_ids.shape[1] > cfg.max_position_embeddings:
            raise ValueError(
                f"input_ids: length L={input_ids.shape[1]} exceeds max_position_embeddings="
                f"{cfg.max_position_embeddings}; truncate the inputs"
            )
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= cfg.vocab_size:
            raise ValueError(
                f"input_ids: expected ids in [0, {cfg.vocab_size}), got range [{lo}, {hi}]"
            )
        shape = tuple(input_ids.shape)
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is None:
                continue
            if not isinstance(t, Tensor) or t.is_floating_point() or t.is_complex():
                got = t.dtype if isinstance(t, Tensor) else type(t).__name__
                raise TypeError(
                    f"{name}: expected an integer or bool torch.Tensor {shape}, got {got}"
                )
            if tuple(t.shape) != shape:
                raise ValueError(
                    f"{name}: expected shape {shape} like input_ids, got {tuple(t.shape)}"
                )
            if t.device != input_ids.device:
                raise ValueError(f"{name}: expected device {input_ids.device}, got {t.device}")
        if attention_mask is not None:
            if attention_mask.dtype != torch.bool:
                if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
                    raise ValueError("attention_mask: expected values 0/1 (1 = real token)")
                attention_mask = attention_mask != 0
            if bool(attention_mask.all()):
                attention_mask = None
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids, dtype=torch.long)
        else:
            lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
            if lo < 0 or hi >= cfg.type_vocab_size:
                raise ValueError(
                    f"token_type_ids: expected values in [0, {cfg.type_vocab_size}), "
                    f"got range [{lo}, {hi}]"
                )
        return input_ids, attention_mask, token_type_ids

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_attentions: bool = False,
    ) -> BertOutput:
        """Encode a batch.

        Args:
            input_ids: (B, L) int token ids, L <= max_position_embeddings.
            attention_mask: (B, L) 1/True = real token, 0/False = padding (keys that no query
                may attend to; padded positions still get (meaningless) states). Default all 1.
                A row with no real token gives zero attention weights (not uniform ones).
            token_type_ids: (B, L) segment ids; default all 0.
            output_attentions: also return every layer's weights (B, H, L, L).
        Returns:
            :class:`BertOutput` with ``last_hidden_state`` (B, L, E).
        """
        if not isinstance(output_attentions, bool):
            raise TypeError(f"output_attentions: expected a bool, got {output_attentions!r}")
        input_ids, attention_mask, token_type_ids = self._check_inputs(
            input_ids, attention_mask, token_type_ids
        )
        # True = may attend, from HF's 1 = real token; padded keys are never attended to.
        mask = None if attention_mask is None else from_key_padding_mask(~attention_mask)
        x = self.embeddings(input_ids, token_type_ids)
        weights = []
        for layer in self.layers:
            x, w = layer.attend(x, mask, output_attentions)
            weights.append(w)
        return BertOutput(x, tuple(weights) if output_attentions else None)

    # --- sentence embeddings ------------------------------------------------------------------
    def embed(self, texts: str | Sequence[str], batch_size: int = 32) -> Tensor:
        """Sentence embeddings (N, E) as sentence-transformers computes them: mean of the
        last hidden states over real (non-padding) tokens, L2-normalised when the model's
        ``modules.json`` lists a Normalize module.

        Texts are sorted by token count, run in batches of ``batch_size`` padded to their
        longest, and returned in the input order. Runs without autograd.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if self.pooling.unsupported or self.pooling.mode != "mean":
            what = list(self.pooling.unsupported) or [self.pooling.mode]
            raise ValueError(
                f"embed: the sentence-transformers modules {what} of "
                f"{self.name_or_path or 'this model'} are not supported (only Transformer, "
                "mean Pooling and Normalize)"
            )
        enc = self._encode(texts)
        order = sorted(range(len(enc)), key=lambda i: -len(enc[i].ids))
        device = self.embeddings.word_embeddings.weight.device
        dtype = self.embeddings.word_embeddings.weight.dtype
        out = torch.empty(len(enc), self.config.hidden_size, dtype=dtype, device=device)
        with torch.inference_mode():
            for s in range(0, len(order), batch_size):
                idx = order[s : s + batch_size]
                ids, att, types = (t.to(device) for t in self._collate([enc[i] for i in idx]))
                h = self(ids, att, types).last_hidden_state  # (b, L, E)
                m = att.to(h.dtype).unsqueeze(-1)  # (b, L, 1)
                e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                if self.pooling.normalize:
                    e = F.normalize(e, p=2.0, dim=1)
                out[torch.tensor(idx, device=device)] = e
        return out


def _map_state_dict(
    raw: dict[str, Tensor], model: BertModel, source: Path, dtype: torch.dtype
) -> dict[str, Tensor]:
    """Rename HuggingFace weights to ``model``'s names and check names and shapes."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state: dict[str, Tensor] = {}
    unknown, bad_shape = [], []
    shape_checked: set[str] = set()
    for name, t in raw.items():
        ours = _rename(name)
        if ours == "":
            continue
        if ours is None or ours not in expected:
            unknown.append(name)
            continue
        if tuple(t.shape) != expected[ours]:
            bad_shape.append(f"{name} {tuple(t.shape)} (expected {expected[ours]})")
            shape_checked.add(ours)
            continue
        state[ours] = t.to(dtype) if t.is_floating_point() else t
    missing = [k for k in expected if k not in state and k not in shape_checked]
    problems = []
    if bad_shape:
        problems.append(f"shape mismatch: {_first(bad_shape)}")
    if missing:
        problems.append(f"missing weights (attnkit names): {_first(missing)}")
    if unknown:
        problems.append(f"unexpected weights: {_first(unknown)}")
    if problems:
        raise ValueError(f"{source}: weights do not match config.json: " + "; ".join(problems))
    return state

"""A BERT-family encoder (BERT, MiniLM, all-MiniLM-L6-v2): config, modules, model.

Absolute positions, token types, GELU (erf), post-norm blocks of
:class:`attnkit.nn.encoder.TransformerEncoderLayer` (:func:`bert_layer`).
:meth:`BertModel.from_pretrained` loads a HuggingFace-layout directory; the reading, checking
and renaming of its files (``config.json``, ``model.safetensors``, ``tokenizer.json`` /
``vocab.txt``, the sentence-transformers files) lives in :mod:`attnkit.models.hf_loading`.

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

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Encoding, Tokenizer
from torch import Tensor, nn

from attnkit import checks
from attnkit.masks import from_key_padding_mask
from attnkit.models import bert_config, bert_inputs
from attnkit.models import hf_loading as hf
from attnkit.models.bert_config import BertConfig
from attnkit.models.bert_inputs import BertInputs
from attnkit.models.hf_loading import SentencePooling
from attnkit.nn.dropout import Dropout
from attnkit.nn.encoder import TransformerEncoderLayer
from attnkit.nn.projection import pack_legacy, unpack
from attnkit.tensor_checks import float_dtype

__all__ = ["BertConfig", "BertInputs", "BertModel", "BertOutput", "SentencePooling"]


def __getattr__(name: str):
    """``MAX_SIZE``'s old path, deprecated (:mod:`attnkit.deprecation`): it is
    :data:`attnkit.models.bert_config.MAX_SIZE`."""
    if name == "MAX_SIZE":
        from attnkit.deprecation import warn

        warn(f"{__name__}.MAX_SIZE")
        return bert_config.MAX_SIZE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class BertOutput:
    """``last_hidden_state`` (B, L, E); ``attentions``: one (B, H, L, L) tensor per layer when
    asked for (``output_attentions=True``), else None."""

    last_hidden_state: Tensor
    attentions: tuple[Tensor, ...] | None = None


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
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.dropout(self.norm(x))


def bert_layer(config: BertConfig) -> TransformerEncoderLayer:
    """One BERT block, a :class:`~attnkit.nn.encoder.TransformerEncoderLayer` (post-norm, GELU)::

        x = norm1(x + dropout1(self_attn(x)))
        x = norm2(x + dropout2(linear2(gelu(linear1(x)))))

    with the config's ``attention_probs_dropout_prob`` on the attention weights and no dropout
    between the activation and ``linear2`` (as BERT; this only matters in training mode)."""
    return TransformerEncoderLayer(
        config.hidden_size,
        config.num_attention_heads,
        config.intermediate_size,
        dropout=config.hidden_dropout_prob,
        activation="gelu",
        layer_norm_eps=config.layer_norm_eps,
        batch_first=True,
        norm_first=False,
        attention_dropout=config.attention_probs_dropout_prob,
        activation_dropout=0.0,
    )


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------
class BertModel(nn.Module):
    """BERT encoder: embeddings, then ``num_hidden_layers`` blocks (:func:`bert_layer`).

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
        self.layers = nn.ModuleList(bert_layer(config) for _ in range(config.num_hidden_layers))
        self.tokenizer = tokenizer
        self.pooling = pooling or SentencePooling(max_seq_length=config.max_position_embeddings)
        self.name_or_path = ""

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype = torch.float32) -> BertModel:
        """Load a HuggingFace-layout directory (files: :mod:`attnkit.models.hf_loading`);
        weights are converted to ``dtype`` (floating).

        Everything is checked before the model is built: the config's values, then the
        config against the weights file's header (tensor names, shapes, dtypes), the
        tokenizer; then each tensor is loaded and checked for NaN / inf.

        Raises:
            FileNotFoundError: the directory or a required file is missing.
            ValueError: an unreadable or corrupt file, an unsupported or absurd config value,
                weights whose names, shapes or dtypes do not match the config, or non-finite
                weights; the message names the file (and the key or tensor). No partially
                loaded model is ever returned.
        """
        if not isinstance(path, (str, Path)):
            raise TypeError(f"path: expected a directory path, got {type(path).__name__}")
        dtype = float_dtype("dtype", dtype, allow_none=False)
        path = Path(path).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"path: {str(path)!r} is not a directory (the bundled all-MiniLM-L6-v2 is at "
                "attnkit.models.default_model_path())"
            )
        config_file, weights_file = path / "config.json", path / "model.safetensors"
        config = BertConfig.from_json(config_file)
        if not weights_file.exists():
            raise FileNotFoundError(
                f"{weights_file}: file not found (only safetensors weights are read, never "
                "pickle files such as pytorch_model.bin)"
            )
        header = hf.read_header(weights_file)
        hf.check_layer_count(weights_file, header, config.num_hidden_layers, config_file)
        pooling = SentencePooling.from_dir(path, config.max_position_embeddings)
        tokenizer = hf.load_tokenizer(path, pooling.max_seq_length, config.vocab_size)
        with torch.device("meta"):  # shapes only: no memory, no random init
            model = cls(config, tokenizer, pooling)
        # BERT keeps query, key and value apart: matched under the separate names, then packed
        expected = {k: tuple(v.shape) for k, v in unpack(model.state_dict()).items()}
        names = hf.match_weights(weights_file, header, expected)
        state = hf.load_weights(weights_file, names, dtype)
        pack_legacy(state)
        model.load_state_dict(state, strict=True, assign=True)
        model.name_or_path = str(path)
        return model.eval()

    # --- tokenizing (attnkit.models.bert_inputs) ------------------------------------------------
    def _encode(self, texts: str | Sequence[str]) -> list[Encoding]:
        return bert_inputs.encode(self.tokenizer, texts)

    def _collate(self, encodings: Sequence[Encoding]) -> tuple[Tensor, Tensor, Tensor]:
        return bert_inputs.collate(
            encodings, bert_inputs.pad_id(self.tokenizer, self.config.pad_token_id)
        )

    def tokenize(self, texts: str | Sequence[str]) -> BertInputs:
        """Tokenize texts ([CLS] text [SEP]), truncated to ``pooling.max_seq_length`` tokens
        (the sentence-transformers max_seq_length, else max_position_embeddings) and
        right-padded to the longest in the batch: tensors (B, L)."""
        pad = bert_inputs.pad_id(self.tokenizer, self.config.pad_token_id)
        return bert_inputs.to_inputs(self._encode(texts), pad)

    # --- forward ------------------------------------------------------------------------------
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
        output_attentions = checks.flag("output_attentions", output_attentions)
        input_ids, attention_mask, token_type_ids = bert_inputs.check(
            self.config, input_ids, attention_mask, token_type_ids
        )
        # True = may attend, from HF's 1 = real token; padded keys are never attended to.
        mask = None if attention_mask is None else from_key_padding_mask(~attention_mask)
        x = self.embeddings(input_ids, token_type_ids)
        weights = []
        for layer in self.layers:
            x, w = (
                layer(x, mask, return_weights=True) if output_attentions else (layer(x, mask), None)
            )
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
        checks.positive_int("batch_size", batch_size)
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

"""The inputs of a BERT-style model: texts to padded tensors of token ids with a
``tokenizers.Tokenizer``, and the checks of a model call's input tensors.

Shape legend: ``B`` texts in the batch, ``L`` tokens of the longest (the others are
right-padded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tokenizers import Encoding, Tokenizer
from torch import Tensor

from attnkit.models.bert_config import BertConfig

__all__ = ["BertInputs", "check", "collate", "encode", "pad_id", "to_inputs"]


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


def encode(tokenizer: Tokenizer | None, texts: str | Sequence[str]) -> list[Encoding]:
    """Encode one text or a non-empty sequence of texts (TypeError / ValueError naming
    ``texts``; ValueError when there is no tokenizer or it fails)."""
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts: expected a str or a sequence of str")
    if len(texts) == 0:
        raise ValueError("texts: expected at least one text, got an empty sequence")
    if tokenizer is None:
        raise ValueError("this model has no tokenizer; load it with BertModel.from_pretrained")
    try:
        return tokenizer.encode_batch(list(texts))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise ValueError(f"texts: the tokenizer cannot encode them ({e})") from None


def pad_id(tokenizer: Tokenizer | None, default: int) -> int:
    """The id of ``[PAD]`` in ``tokenizer``, else ``default``."""
    pid = None if tokenizer is None else tokenizer.token_to_id("[PAD]")
    return default if pid is None else pid


def collate(encodings: Sequence[Encoding], pad: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad encodings to their longest: ids, attention mask, token types, each (B, L)."""
    n = max(len(e.ids) for e in encodings)
    ids = torch.tensor([e.ids + [pad] * (n - len(e.ids)) for e in encodings])
    types = torch.tensor([e.type_ids + [0] * (n - len(e.ids)) for e in encodings])
    att = torch.tensor([[1] * len(e.ids) + [0] * (n - len(e.ids)) for e in encodings])
    return ids, att, types


def to_inputs(encodings: Sequence[Encoding], pad: int) -> BertInputs:
    """The padded batch with its special-token mask and token strings."""
    ids, att, types = collate(encodings, pad)
    n = ids.shape[1]
    special = torch.tensor([e.special_tokens_mask + [1] * (n - len(e.ids)) for e in encodings])
    return BertInputs(ids, att, types, special, [list(e.tokens) for e in encodings])


def _int_tensor(name: str, t: object, bools: bool) -> Tensor:
    """``t`` if it is an integer (or, with ``bools``, bool) tensor, else TypeError."""
    if (
        not isinstance(t, Tensor)
        or t.is_floating_point()
        or t.is_complex()
        or (t.dtype == torch.bool and not bools)
    ):
        got = t.dtype if isinstance(t, Tensor) else type(t).__name__
        kind = "an integer or bool" if bools else "an integer"
        raise TypeError(f"{name}: expected {kind} torch.Tensor (B, L), got {got}")
    return t


def _in_range(name: str, what: str, t: Tensor, high: int) -> None:
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= high:
        raise ValueError(f"{name}: expected {what} in [0, {high}), got range [{lo}, {hi}]")


def check(
    cfg: BertConfig, input_ids: object, attention_mask: object, token_type_ids: object
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Check a model call's inputs against config ``cfg``: ids (B, L) in range, L within the
    positions, masks and token types of the same shape and device. Returns ``input_ids``, the
    attention mask as bool (None when every token is real) and the token types (zeros by
    default)."""
    ids = _int_tensor("input_ids", input_ids, bools=False)
    if ids.dim() != 2 or 0 in ids.shape:
        raise ValueError(
            f"input_ids: expected a non-empty (B, L) tensor, got shape {tuple(ids.shape)}"
        )
    if ids.shape[1] > cfg.max_position_embeddings:
        raise ValueError(
            f"input_ids: length L={ids.shape[1]} exceeds max_position_embeddings="
            f"{cfg.max_position_embeddings}; truncate the inputs"
        )
    _in_range("input_ids", "ids", ids, cfg.vocab_size)
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None:
            _int_tensor(name, t, bools=True)
            if tuple(t.shape) != tuple(ids.shape):
                raise ValueError(
                    f"{name}: expected shape {tuple(ids.shape)} like input_ids, got "
                    f"{tuple(t.shape)}"
                )
            if t.device != ids.device:
                raise ValueError(f"{name}: expected device {ids.device}, got {t.device}")
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
                raise ValueError("attention_mask: expected values 0/1 (1 = real token)")
            attention_mask = attention_mask != 0
        if bool(attention_mask.all()):
            attention_mask = None
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(ids, dtype=torch.long)
    _in_range("token_type_ids", "values", token_type_ids, cfg.type_vocab_size)
    return ids, attention_mask, token_type_ids

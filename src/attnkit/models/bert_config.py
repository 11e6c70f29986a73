"""The configuration of the BERT-family encoder (:mod:`attnkit.models.bert`): the parts of a
HuggingFace BERT ``config.json`` it uses, checked on construction. Below both the model and its
inputs (:mod:`attnkit.models.bert_inputs`), which read it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from attnkit import checks
from attnkit.models import hf_loading as hf

__all__ = ["MAX_SIZE", "BertConfig"]

MAX_SIZE = 2**31 - 1
"""Largest size (vocabulary, width, layers, positions) a config may give."""


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BertConfig:
    """The parts of a HuggingFace BERT ``config.json`` this encoder uses (checked on
    construction: TypeError / ValueError naming the field)."""

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

    _SUPPORTED = {
        "model_type": ("bert",),
        "position_embedding_type": ("absolute",),
        "hidden_act": ("gelu",),
        "is_decoder": (False,),
        "add_cross_attention": (False,),
    }

    def __post_init__(self) -> None:
        for f in fields(self)[:7]:
            checks.positive_int(f.name, getattr(self, f.name), MAX_SIZE)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size: expected a multiple of num_attention_heads="
                f"{self.num_attention_heads}, got {self.hidden_size}"
            )
        checks.positive_float("layer_norm_eps", self.layer_norm_eps)
        checks.probability("hidden_dropout_prob", self.hidden_dropout_prob)
        checks.probability("attention_probs_dropout_prob", self.attention_probs_dropout_prob)
        checks.integer("pad_token_id", self.pad_token_id, 0, self.vocab_size - 1)

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> BertConfig:
        """Validate a config dict; every error is a ValueError starting with ``source``.

        Refuses a missing key, a value of the wrong type or out of range, and unsupported
        settings (model_type other than "bert", position_embedding_type other than
        "absolute", hidden_act other than "gelu", decoder / cross-attention configs)."""
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(d).__name__}")
        for key, ok in cls._SUPPORTED.items():
            if key in d and d[key] not in ok:
                raise ValueError(
                    f"{source}: unsupported {key}={checks.show(d[key])}; this BERT encoder "
                    f"supports {key} in {list(ok)}"
                )
        names = [f.name for f in fields(cls)]
        missing = [k for k in names[:6] if k not in d]
        if missing:
            raise ValueError(f"{source}: missing required key(s) {missing}")
        kw = {k: d[k] for k in names if k in d}
        if "pad_token_id" in kw and kw["pad_token_id"] is None:  # null: the default, 0
            del kw["pad_token_id"]
        try:
            return cls(**kw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """Read and validate a ``config.json``."""
        path = Path(path)
        return cls.from_dict(hf.read_json_object(path), str(path))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

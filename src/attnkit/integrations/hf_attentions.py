"""Deprecated (:mod:`attnkit.deprecation`): the old name of
:mod:`attnkit.integrations.hf_attention_weights` (a transformers model's attention weights on a
text, beside :mod:`attnkit.integrations.hf_attention_forward`, the attention function
registered with transformers); importable, with a warning, until the date listed there."""

from __future__ import annotations

from attnkit.deprecation import warn
from attnkit.integrations.hf_attention_weights import (
    AttentionSection,
    LoadedModel,
    ModelAttentions,
    load_model,
    model_attentions,
)

warn(__name__)

__all__ = ["AttentionSection", "LoadedModel", "ModelAttentions", "load_model", "model_attentions"]

"""Deprecated (:mod:`attnkit.deprecation`): moved to :mod:`attnkit.explain.model_attention` (the
report) and :mod:`attnkit.explain.render` (``render_model_attention``); this old path keeps the
same names importable, with a warning, until the date listed there."""

from attnkit.deprecation import warn
from attnkit.explain.model_attention import (
    Attended,
    ModelAttentionReport,
    find_word,
    model_attention_report,
)
from attnkit.explain.render import render_model_attention

warn(__name__)

__all__ = [
    "Attended",
    "ModelAttentionReport",
    "find_word",
    "model_attention_report",
    "render_model_attention",
]

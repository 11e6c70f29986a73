"""Moved to :mod:`attnkit.explain.model_attention` (the report) and :mod:`attnkit.explain.render`
(``render_model_attention``); this alias keeps ``attnkit.viz.model_attention`` importable with
the same names."""

from attnkit.explain.model_attention import (
    Attended,
    ModelAttentionReport,
    find_word,
    model_attention_report,
)
from attnkit.explain.render import render_model_attention

__all__ = [
    "Attended",
    "ModelAttentionReport",
    "find_word",
    "model_attention_report",
    "render_model_attention",
]

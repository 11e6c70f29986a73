"""Old import paths kept for a while, each with a date: importing one warns
(``DeprecationWarning``) with its new path and the date after which it is removed.

A public name that moves keeps its old path for about three months, listed in :data:`MOVED`;
``tests/test_deprecation.py`` fails once a date has passed, so the old path is then deleted
rather than kept for ever. Private names (a leading underscore) carry no promise and are
removed with their last use.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

__all__ = ["MOVED", "Moved", "warn"]


@dataclass(frozen=True)
class Moved:
    """``old`` (a module or ``module.NAME``) is now ``new``: moved on ``since``, the old path
    removed after ``removal`` (ISO dates)."""

    old: str
    new: str
    since: str
    removal: str


MOVED = (
    Moved(
        "attnkit.viz.model_attention",
        "attnkit.explain.model_attention (render_model_attention: attnkit.explain.render)",
        since="2026-11-22",
        removal="2027-02-28",
    ),
    Moved("attnkit.masks.combine", "attnkit.masks", since="2026-11-26", removal="2027-02-28"),
    Moved(
        "attnkit.integrations.hf_attentions",
        "attnkit.integrations.hf_attention_weights",
        since="2026-11-28",
        removal="2027-02-28",
    ),
    Moved(
        "attnkit.models.bert.MAX_SIZE",
        "attnkit.models.bert_config.MAX_SIZE",
        since="2026-11-26",
        removal="2027-02-28",
    ),
)
"""Every old path still importable, with its dates."""


def warn(old: str) -> None:
    """Warn that ``old`` (an entry of :data:`MOVED`) is deprecated: its new path and the date
    after which it is removed."""
    moved = next(m for m in MOVED if m.old == old)
    warnings.warn(
        f"{moved.old} is deprecated (moved on {moved.since}): import from {moved.new}; the old "
        f"path is removed after {moved.removal}",
        DeprecationWarning,
        stacklevel=3,
    )

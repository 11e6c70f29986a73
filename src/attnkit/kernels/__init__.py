"""Attention backends, one file each, and the registry the dispatcher reads.

``BACKENDS`` (:mod:`attnkit.kernels.registry`) maps a name to a backend instance;
:mod:`attnkit.kernels.dispatch` holds the preference order (``preference(kind)``) and chooses
the backend of each call.
"""

from __future__ import annotations

from attnkit.kernels.call.base import AttentionCall, Backend
from attnkit.kernels.dispatch import preference
from attnkit.kernels.registry import BACKENDS

__all__ = ["BACKENDS", "AttentionCall", "Backend", "preference"]

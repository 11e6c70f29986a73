"""The old import path of :class:`~attnkit.masks.base.Intersection` and
:class:`~attnkit.masks.base.Union`, which now live in :mod:`attnkit.masks.base` beside the
operators (``&``, ``|``) that build them."""

from __future__ import annotations

from attnkit.masks.base import Intersection, Union

__all__ = ["Intersection", "Union"]

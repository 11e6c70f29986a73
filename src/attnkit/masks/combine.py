"""Deprecated (:mod:`attnkit.deprecation`): the old import path of
:class:`~attnkit.masks.base.Intersection` and :class:`~attnkit.masks.base.Union`, which live in
:mod:`attnkit.masks.base` beside the operators (``&``, ``|``) that build them and are exported
by :mod:`attnkit.masks`; importable, with a warning, until the date listed there."""

from __future__ import annotations

from attnkit.deprecation import warn
from attnkit.masks.base import Intersection, Union

warn(__name__)

__all__ = ["Intersection", "Union"]

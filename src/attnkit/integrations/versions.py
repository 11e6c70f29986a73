"""The transformers releases the integration was tested with, and the check that runs before it
is used. The one place that records the range: ``pyproject.toml``'s lower bound, the README
and ``make compat`` (``scripts/compat.py``) read it from here (a test keeps them in step).

The integration detects features, not version numbers: :func:`check_transformers` looks up every
name it uses in transformers. When one is missing it raises :class:`UnsupportedTransformersError`
naming the installed version, the tested range and the missing names. Above the tested range it
warns once per process (:class:`UntestedTransformersWarning`) and goes on.

Importing this module does not import transformers.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from types import ModuleType

__all__ = [
    "NEEDED",
    "TRANSFORMERS_OLDEST",
    "TRANSFORMERS_TESTED",
    "TestedRange",
    "UnsupportedTransformersError",
    "UntestedTransformersWarning",
    "check_transformers",
    "tested_range",
]


@dataclass(frozen=True)
class TestedRange:
    """The transformers releases ``tests/integrations`` passed with: ``oldest`` is
    ``pyproject.toml``'s lower bound (``transformers>=oldest``), ``newest`` the newest release
    ``make compat`` ran green. No upper bound is enforced: newer releases get a warning."""

    __test__ = False  # not a pytest class

    oldest: str
    newest: str

    def __str__(self) -> str:
        return f"{self.oldest} to {self.newest}"


TRANSFORMERS_OLDEST = "5.23.0"
TRANSFORMERS_TESTED = "5.24.0"

NEEDED: dict[str, tuple[str, ...]] = {
    "": ("AttentionInterface",),
    "masking_utils": (
        "AttentionMaskInterface",
        "and_masks",
        "or_masks",
        "causal_mask_function",
        "bidirectional_mask_function",
        "sliding_window_overlay",
        "sliding_window_bidirectional_overlay",
        "padding_mask_function",
        "packed_sequence_mask_function",
        "remap_positions_for_packed_sequence",
        "add_offsets_to_mask_function",
    ),
}
"""transformers' submodule ("" for the package) -> the names the integration uses from it."""


class UnsupportedTransformersError(ImportError):
    """The installed transformers lacks a feature attnkit's integration needs."""


class UntestedTransformersWarning(UserWarning):
    """The installed transformers is newer than the newest release attnkit was tested with; every
    feature the integration needs is there, so it goes on. Silence it with
    ``warnings.filterwarnings("ignore", category=UntestedTransformersWarning)``."""


def tested_range() -> TestedRange:
    """The tested transformers range (oldest allowed, newest tested)."""
    return TestedRange(TRANSFORMERS_OLDEST, TRANSFORMERS_TESTED)


_CHECKED: set[tuple[str, str]] = set()
"""(package name, version) pairs already checked in this process."""


def check_transformers(transformers: ModuleType) -> None:
    """Refuse a transformers without the features the integration needs, warn once when it is
    newer than the tested range. ``transformers``: the imported module.

    Raises :class:`UnsupportedTransformersError` naming the installed version, the tested range
    and the missing names, before any transformers function is called."""
    from packaging.version import InvalidVersion, Version  # a dependency of transformers

    version = str(getattr(transformers, "__version__", "unknown"))
    key = (transformers.__name__, version)
    if key in _CHECKED:
        return
    rng = tested_range()
    missing = []
    for sub, names in NEEDED.items():
        module_name = f"{transformers.__name__}.{sub}" if sub else transformers.__name__
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        missing += [f"{module_name}.{n}" for n in names if not hasattr(module, n)]
    if missing:
        raise UnsupportedTransformersError(
            f"attnkit's transformers integration needs {', '.join(missing)}, which transformers "
            f"{version} does not have; attnkit is tested with transformers {rng}: "
            f"pip install 'transformers>={rng.oldest}'"
        )
    try:
        installed = Version(version)
    except InvalidVersion:
        installed = Version(rng.newest)  # features are there: treat it as tested
    if installed < Version(rng.oldest):
        raise UnsupportedTransformersError(
            f"transformers {version} is older than attnkit supports (tested range {rng}): "
            f"pip install 'transformers>={rng.oldest}'"
        )
    if installed > Version(rng.newest):
        warnings.warn(
            f"transformers {version} is newer than the newest release attnkit was tested with "
            f"({rng}); every feature the integration needs is there, so it goes on",
            UntestedTransformersWarning,
            stacklevel=3,
        )
    _CHECKED.add(key)

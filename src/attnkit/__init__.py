"""attnkit: attention, exact and fast.

Tiers (each only calls the ones above it): ``reference`` (float64 NumPy oracle) and ``masks`` ->
``kernels`` + ``functional`` -> ``nn`` -> ``models`` / ``viz`` / ``cli``.

The public functions below are imported on first use, so that ``attnkit --help`` does not pay
for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit.lazy import lazy_exports
from attnkit.version import __version__ as __version__

_LAZY = {
    "PrecisionWarning": "attnkit.kernels.policy.precision",
    "additive_attention": "attnkit.functional",
    "dot_product_attention": "attnkit.functional",
    "explain_dispatch": "attnkit.functional",
    "general_attention": "attnkit.functional",
    "multi_head_attention": "attnkit.functional",
    "scaled_dot_product_attention": "attnkit.functional",
}
_SUBMODULES = {
    "masks",
    "reference",
    "functional",
    "kernels",
    "nn",
    "models",
    "train",
    "viz",
    "explain",
}

__all__ = sorted(_LAZY) + sorted(_SUBMODULES)

if TYPE_CHECKING:  # pragma: no cover
    from attnkit import (  # noqa: F401
        explain,
        functional,
        kernels,
        masks,
        models,
        nn,
        reference,
        train,
        viz,
    )
    from attnkit.functional import (  # noqa: F401
        additive_attention,
        dot_product_attention,
        explain_dispatch,
        general_attention,
        multi_head_attention,
        scaled_dot_product_attention,
    )
    from attnkit.kernels.policy.precision import PrecisionWarning  # noqa: F401


__getattr__ = lazy_exports(__name__, {**_LAZY, **{name: f"attnkit.{name}" for name in _SUBMODULES}})

"""attnkit: attention, exact and fast.

Tiers (each only calls the ones above it): ``reference`` (float64 NumPy oracle) and ``masks`` ->
``kernels`` + ``functional`` -> ``nn`` -> ``models`` / ``train`` / ``viz`` / ``cli``.
"""

from attnkit import masks
from attnkit.functional import (
    additive_attention,
    dot_product_attention,
    explain_dispatch,
    general_attention,
    multi_head_attention,
    scaled_dot_product_attention,
)

__version__ = "0.1.0"

__all__ = [
    "additive_attention",
    "dot_product_attention",
    "explain_dispatch",
    "general_attention",
    "masks",
    "multi_head_attention",
    "scaled_dot_product_attention",
]

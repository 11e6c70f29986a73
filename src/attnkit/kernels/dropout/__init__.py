"""Element-wise dropout for the layers (``attnkit.nn.dropout``): a counter-based keep mask
applied in one numba pass, torch's dropout where it does not serve.

- :mod:`.elementwise` — :func:`dropout`, what it serves, the autograd Function.
- :mod:`.nb_kernels` — the numba kernels (the hash, forward and backward).
"""

from attnkit.kernels.dropout.elementwise import (
    MIN_ELEMENTS,
    DropoutFunction,
    dropout,
    served,
    threshold,
)

__all__ = ["MIN_ELEMENTS", "DropoutFunction", "dropout", "served", "threshold"]

"""``Dropout``: ``torch.nn.Dropout`` whose training-mode pass is attnkit's one-pass dropout
(:func:`attnkit.kernels.dropout.dropout`: a counter-based keep mask, about ten times faster than
torch's Bernoulli draw on the CPU, and a one-byte mask kept for the backward instead of a
float one). Same semantics: in training mode each element is zeroed with probability ``p`` and
the others are scaled by 1 / (1 - p); in eval mode the input is returned as is. Tensors the
kernel does not serve (other devices and dtypes, small or non-contiguous ones, ``inplace=True``,
under ``torch.compile``) take torch's own dropout. The layers' residual, feed-forward and
embedding dropouts are these modules (the attention weights' dropout is the attention
backend's).

Shapes: any input, output of the same shape.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.kernels.dropout import dropout

__all__ = ["Dropout"]


class Dropout(nn.Dropout):
    """``torch.nn.Dropout(p, inplace)`` with attnkit's training-mode pass (module docstring);
    still an ``nn.Dropout`` (``isinstance`` checks, ``p``, no parameters or state)."""

    def forward(self, x: Tensor) -> Tensor:
        """x (any shape) -> the same shape."""
        if not self.training or self.inplace:
            return super().forward(x)
        return dropout(x, self.p)

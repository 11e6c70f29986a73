"""Single-head self-attention, the module of seed 002.

Shape legend: ``B`` batch, ``L`` sequence length, ``E`` d_model, ``dk`` / ``dv`` query-key /
value widths.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit import checks
from attnkit import functional as F
from attnkit import tensor_checks as tc
from attnkit.masks import Mask

__all__ = ["SelfAttention"]


class SelfAttention(nn.Module):
    """softmax(Q Kᵀ / sqrt(d_k)) V with Q = X W^Q, K = X W^K, V = X W^V (seed 002).

    The projections are ``torch.nn.Linear`` modules named ``WQ``, ``WK``, ``WV`` as in the seed,
    so a ``state_dict`` of the seed's module loads as is. ``WQ.weight`` is (d_k, d_model), i.e.
    the seed's W^Q (d_model, d_k) transposed.

    Args:
        d_model: E, input width.
        d_k: query/key width.
        d_v: value (and output) width.
        bias: whether the projections have a bias (the seed's ``nn.Linear`` default: True).

    Example (the seed's run example)::

        sa = SelfAttention(512, 64, 64)
        sa(torch.randn(2, 10, 512)).shape   # torch.Size([2, 10, 64])
    """

    def __init__(self, d_model: int, d_k: int, d_v: int, bias: bool = True) -> None:
        super().__init__()
        d_model, d_k, d_v = (
            checks.positive_int(n, x) for n, x in (("d_model", d_model), ("d_k", d_k), ("d_v", d_v))
        )
        bias = checks.flag("bias", bias)
        self.d_model, self.d_k, self.d_v = d_model, d_k, d_v
        self.WQ = nn.Linear(d_model, d_k, bias=bias)
        self.WK = nn.Linear(d_model, d_k, bias=bias)
        self.WV = nn.Linear(d_model, d_v, bias=bias)

    def forward(
        self, x: Tensor, mask: Mask | Tensor | None = None, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Self-attention over the rows of x.

        Args:
            x: (B, L, E) (any leading dims (..., L, E) work).
            mask: True = may attend; a bool/float tensor broadcastable to (..., L, L) (the
                seed's (B, L, L) 0/1 mask as a bool or integer tensor, nonzero = may attend) or
                an :mod:`attnkit.masks` object. A *float* tensor is added to the scores (the
                attnkit convention), unlike the seed, which would treat float 0/1 as a 0/1 mask.
                Rows with no allowed key give output 0 (the seed gives uniform weights).
            return_weights: also return the attention weights (..., L, L).

        Returns:
            output (..., L, d_v), or (output, weights) when ``return_weights``.
        """
        checks.flag("return_weights", return_weights)
        x = tc.tensor("x", x)
        if x.dim() < 2 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x: expected shape (B, L, d_model={self.d_model}), got {tuple(x.shape)}"
            )
        tc.like("x", x, self.WQ.weight, "the module's parameters")
        if 0 in x.shape:
            raise ValueError(f"x: expected non-empty dims, got shape {tuple(x.shape)}")
        if isinstance(mask, Tensor) and mask.dtype != torch.bool and not mask.is_floating_point():
            # the seed's 0/1 integer masks (mask == 0 means masked)
            mask = mask != 0
        length = x.shape[-2]
        F.check_mask(mask, tuple(x.shape[:-2]), length, length, x.device)
        q, k, v = self.WQ(x), self.WK(x), self.WV(x)
        return F.scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_k={self.d_k}, d_v={self.d_v}"
